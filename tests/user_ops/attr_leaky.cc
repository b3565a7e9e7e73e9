// attrdemo::leaky: leaky ReLU with the attribute slope.
#include "opbridge_kernel.h"
namespace opbridge {
namespace {
struct Leaky {
  float slope = 0.f;
  static Status Read(const Attributes& attrs, Leaky* self) { return attrs.get("slope", &self->slope); }
  Status Compute(Context& ctx) const {
    const TensorView& x = ctx.input(0);
    if (x.dtype != DType::kFloat) return Fail("input 'x' must be float32");
    Span<float> out;
    OPBRIDGE_RETURN_IF_ERROR(ctx.output(0, x.shape, &out));
    auto in = x.span<float>();
    for (int64_t i = 0; i < out.size; ++i) out[i] = in[i] >= 0.f ? in[i] : slope * in[i];
    return Status::OK();
  }
};
}  // namespace
extern const KernelDef kernel_attrdemo_op_leaky = make_kernel<Leaky>();
}  // namespace opbridge
