// opbridge::identity_conv — 1x1 convolution with identity weights: output = input, with the
// channel count checked against the `channels` attribute. Mirrors custom_ops/identity_conv.py.
#include <cstring>

#include "opbridge_kernel.h"

namespace opbridge {
namespace {

Status identity_conv(const TensorView& x, int64_t channels, void* out) {
  std::memcpy(out, x.data, static_cast<size_t>(x.numel()) * dtype_size(x.dtype));
  (void)channels;
  return Status::OK();
}

struct IdentityConv {
  int64_t channels = 0;

  static Status Read(const Attributes& attrs, IdentityConv* self) {
    return attrs.get("channels", &self->channels);
  }

  Status Compute(Context& ctx) const {
    const TensorView& x = ctx.input(0);
    OPBRIDGE_RETURN_IF_ERROR(expect_min_rank(x, "x", 2));
    if (x.shape[1] != channels)
      return Fail("input 'x' must be (N, channels=", channels, ", ...), got shape ", shape_str(x.shape));
    void* out = nullptr;
    OPBRIDGE_RETURN_IF_ERROR(ctx.output(0, x.shape, &out));
    return identity_conv(x, channels, out);
  }
};

}  // namespace

extern const KernelDef kernel_opbridge_op_identity_conv = make_kernel<IdentityConv>();

}  // namespace opbridge
