// attrdemo::divide: x / d, d a float attribute (its sign of zero decides the sign of x / 0).
#include "opbridge_kernel.h"
namespace opbridge {
namespace {
struct Divide {
  float d = 1.f;
  static Status Read(const Attributes& attrs, Divide* self) { return attrs.get("d", &self->d); }
  Status Compute(Context& ctx) const {
    const TensorView& x = ctx.input(0);
    if (x.dtype != DType::kFloat) return Fail("input 'x' must be float32");
    Span<float> out;
    OPBRIDGE_RETURN_IF_ERROR(ctx.output(0, x.shape, &out));
    auto in = x.span<float>();
    for (int64_t i = 0; i < out.size; ++i) out[i] = in[i] / d;
    return Status::OK();
  }
};
}  // namespace
extern const KernelDef kernel_attrdemo_op_divide = make_kernel<Divide>();
}  // namespace opbridge
