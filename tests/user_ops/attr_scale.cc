// attrdemo::scale: x * k, k a keyword-only int attribute.
#include "opbridge_kernel.h"
namespace opbridge {
namespace {
struct Scale {
  int64_t k = 0;
  static Status Read(const Attributes& attrs, Scale* self) { return attrs.get("k", &self->k); }
  Status Compute(Context& ctx) const {
    const TensorView& x = ctx.input(0);
    if (x.dtype != DType::kFloat) return Fail("input 'x' must be float32");
    Span<float> out;
    OPBRIDGE_RETURN_IF_ERROR(ctx.output(0, x.shape, &out));
    auto in = x.span<float>();
    for (int64_t i = 0; i < out.size; ++i) out[i] = in[i] * static_cast<float>(k);
    return Status::OK();
  }
};
}  // namespace
extern const KernelDef kernel_attrdemo_op_scale = make_kernel<Scale>();
}  // namespace opbridge
