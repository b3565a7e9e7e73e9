// fndemo::Scale: x * factor, the node a torch.autograd.Function's symbolic writes
// (g.op("fndemo::Scale", x, factor_f=factor); tests/test_functions.py).
#include "opbridge_kernel.h"
namespace opbridge {
namespace {
struct Scale {
  float factor = 1.f;
  static Status Read(const Attributes& attrs, Scale* self) { return attrs.get("factor", &self->factor); }
  Status Compute(Context& ctx) const {
    const TensorView& x = ctx.input(0);
    if (x.dtype != DType::kFloat) return Fail("input 'x' must be float32, got ", dtype_name(x.dtype));
    Span<float> out;
    OPBRIDGE_RETURN_IF_ERROR(ctx.output(0, x.shape, &out));
    auto in = x.span<float>();
    for (int64_t i = 0; i < out.size; ++i) out[i] = in[i] * factor;
    return Status::OK();
  }
};
}  // namespace
extern const KernelDef kernel_fndemo_op_Scale = make_kernel<Scale>();
}  // namespace opbridge
