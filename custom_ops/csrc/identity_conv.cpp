// opbridge::identity_conv in its original form: a C++ op kernel and the torchbind class
// IdentityConvClass(channels), one shared library loaded with torch.ops.load_library. The op's
// schema is declared from Python (custom_ops/identity_conv.py, the same string as before), so the
// op is known, bridged and exportable before this library is built: it is built and loaded on the
// op's first eager call or the class's first construction. Fakes and autograd are registered from
// Python; opbridge bridges the op with bridge.register, never redefining it.
//
// identity_conv(x, channels): a 1x1 convolution with identity weights over `channels` channels,
// so the output is a copy of x (N, channels, ...); channels is checked against x.shape[1].
// IdentityConvClass.forward(x) is the same with the channel count as object state;
// __obj_flatten__ exposes it as (("channels", channels),), which export turns into an attribute.
#include <torch/custom_class.h>
#include <torch/library.h>
#include <torch/script.h>

#include <sstream>
#include <string>

namespace {

std::string shape_str(const at::Tensor& x) {
  std::ostringstream s;
  s << "(";
  for (int64_t i = 0; i < x.dim(); ++i) s << (i ? ", " : "") << x.size(i);
  s << (x.dim() == 1 ? ",)" : ")");
  return s.str();
}

// NOTE: the checks and messages of the op's one validation spec (CHECKS in identity_conv.py).
at::Tensor identity_conv(const at::Tensor& x, int64_t channels) {
  TORCH_CHECK_VALUE(x.dim() >= 2, "opbridge: opbridge::identity_conv: input 'x' must be (N, channels, ...). ",
                    "Got shape ", shape_str(x), ". Pass x.dim() >= 2.");
  TORCH_CHECK_VALUE(x.size(1) == channels, "opbridge: opbridge::identity_conv: input 'x' must be (N, channels=",
                    channels, ", ...). Got shape ", shape_str(x), ". Pass channels=x.shape[1].");
  return x.clone();
}

struct IdentityConvClass : torch::CustomClassHolder {
  int64_t channels;
  explicit IdentityConvClass(int64_t c) : channels(c) {
    TORCH_CHECK(c > 0, "opbridge: IdentityConvClass needs channels > 0. Got ", c, ". Pass the input's channel count.");
  }

  at::Tensor forward(const at::Tensor& x) const {
    TORCH_CHECK(x.dim() >= 2 && x.size(1) == channels, "opbridge: IdentityConvClass(channels=", channels,
                ").forward expects (N, ", channels, ", ...). Got shape ", x.sizes(), ". Pass channels=x.shape[1].");
    return x.clone();
  }

  std::tuple<std::tuple<std::string, int64_t>> __obj_flatten__() const {
    return std::make_tuple(std::make_tuple(std::string("channels"), channels));
  }
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(opbridge, m) {
  m.class_<IdentityConvClass>("IdentityConvClass")
      .def(torch::init<int64_t>())
      .def("forward", &IdentityConvClass::forward)
      .def("__obj_flatten__", &IdentityConvClass::__obj_flatten__)
      .def_pickle(
          [](const c10::intrusive_ptr<IdentityConvClass>& self) -> int64_t { return self->channels; },
          [](int64_t channels) { return c10::make_intrusive<IdentityConvClass>(channels); });
}

TORCH_LIBRARY_IMPL(opbridge, CPU, m) {
  m.impl("identity_conv", &identity_conv);
}
