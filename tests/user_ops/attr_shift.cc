// attrdemo::shift: x + k, or x + 100 when the optional attribute k is None (the node omits it).
#include "opbridge_kernel.h"
namespace opbridge {
namespace {
struct Shift {
  bool has_k = false;
  int64_t k = 0;
  static Status Read(const Attributes& attrs, Shift* self) {
    self->has_k = attrs.get("k", &self->k).ok();  // NOTE: an omitted optional attribute is None
    return Status::OK();
  }
  Status Compute(Context& ctx) const {
    const TensorView& x = ctx.input(0);
    if (x.dtype != DType::kFloat) return Fail("input 'x' must be float32");
    Span<float> out;
    OPBRIDGE_RETURN_IF_ERROR(ctx.output(0, x.shape, &out));
    const float step = static_cast<float>(has_k ? k : 100);
    auto in = x.span<float>();
    for (int64_t i = 0; i < out.size; ++i) out[i] = in[i] + step;
    return Status::OK();
  }
};
}  // namespace
extern const KernelDef kernel_attrdemo_op_shift = make_kernel<Shift>();
}  // namespace opbridge
