// attrdemo::divide_all: x divided by each value of the float[] attribute ds in turn.
#include "opbridge_kernel.h"
namespace opbridge {
namespace {
struct DivideAll {
  std::vector<float> ds;
  static Status Read(const Attributes& attrs, DivideAll* self) { return attrs.get("ds", &self->ds); }
  Status Compute(Context& ctx) const {
    const TensorView& x = ctx.input(0);
    if (x.dtype != DType::kFloat) return Fail("input 'x' must be float32");
    Span<float> out;
    OPBRIDGE_RETURN_IF_ERROR(ctx.output(0, x.shape, &out));
    auto in = x.span<float>();
    for (int64_t i = 0; i < out.size; ++i) {
      float v = in[i];
      for (float d : ds) v /= d;
      out[i] = v;
    }
    return Status::OK();
  }
};
}  // namespace
extern const KernelDef kernel_attrdemo_op_divide_all = make_kernel<DivideAll>();
}  // namespace opbridge
