// optdemo::clip_min: max(x, lo), or x when the optional input lo is omitted (it then arrives
// as an undefined TensorView).
#include "opbridge_kernel.h"
namespace opbridge {
namespace {
struct ClipMin {
  static Status Read(const Attributes&, ClipMin*) { return Status::OK(); }
  Status Compute(Context& ctx) const {
    const TensorView& x = ctx.input(0);
    const TensorView& lo = ctx.input(1);
    if (x.dtype != DType::kFloat) return Fail("input 'x' must be float32");
    Span<float> out;
    OPBRIDGE_RETURN_IF_ERROR(ctx.output(0, x.shape, &out));
    auto in = x.span<float>();
    const bool has_lo = lo.dtype != DType::kUndefined;
    if (has_lo && lo.numel() != 1) return Fail("input 'lo' must hold one value, got shape ", shape_str(lo.shape));
    const float m = has_lo ? lo.span<float>()[0] : 0.f;
    for (int64_t i = 0; i < out.size; ++i) out[i] = has_lo && in[i] < m ? m : in[i];
    return Status::OK();
  }
};
}  // namespace
extern const KernelDef kernel_optdemo_op_clip_min = make_kernel<ClipMin>();
}  // namespace opbridge
