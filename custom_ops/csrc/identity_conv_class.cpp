// IdentityConvClass(channels): the stateful (torchbind) form of opbridge::identity_conv.
// forward(x) returns a copy of x after checking x is (N, channels, ...). __obj_flatten__ exposes
// the state as (("channels", channels),), which export turns into ONNX attributes.
#include <torch/custom_class.h>
#include <torch/script.h>

namespace {

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

TORCH_LIBRARY(opbridge_classes, m) {
  m.class_<IdentityConvClass>("IdentityConvClass")
      .def(torch::init<int64_t>())
      .def("forward", &IdentityConvClass::forward)
      .def("__obj_flatten__", &IdentityConvClass::__obj_flatten__)
      .def_pickle(
          [](const c10::intrusive_ptr<IdentityConvClass>& self) -> int64_t { return self->channels; },
          [](int64_t channels) { return c10::make_intrusive<IdentityConvClass>(channels); });
}
