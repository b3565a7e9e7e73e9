// attrdemo::offsets: x + sum(steps), steps an int[] attribute (possibly empty).
#include "opbridge_kernel.h"
namespace opbridge {
namespace {
struct Offsets {
  int64_t total = 0;
  static Status Read(const Attributes& attrs, Offsets* self) {
    std::vector<int64_t> steps;
    OPBRIDGE_RETURN_IF_ERROR(attrs.get("steps", &steps));
    for (int64_t s : steps) self->total += s;
    return Status::OK();
  }
  Status Compute(Context& ctx) const {
    const TensorView& x = ctx.input(0);
    if (x.dtype != DType::kFloat) return Fail("input 'x' must be float32");
    Span<float> out;
    OPBRIDGE_RETURN_IF_ERROR(ctx.output(0, x.shape, &out));
    auto in = x.span<float>();
    for (int64_t i = 0; i < out.size; ++i) out[i] = in[i] + static_cast<float>(total);
    return Status::OK();
  }
};
}  // namespace
extern const KernelDef kernel_attrdemo_op_offsets = make_kernel<Offsets>();
}  // namespace opbridge
