// mmdeploy::p33b_twice: 2 * x, an opbridge kernel in the domain mmdeploy's own library registers
// (tests/test_kernel_libraries.py: two libraries of one domain are refused before onnxruntime).
#include "opbridge_kernel.h"
namespace opbridge {
namespace {
struct Twice {
  static Status Read(const Attributes&, Twice*) { return Status::OK(); }
  Status Compute(Context& ctx) const {
    const TensorView& x = ctx.input(0);
    if (x.dtype != DType::kFloat) return Fail("input 'x' must be float32");
    Span<float> out;
    OPBRIDGE_RETURN_IF_ERROR(ctx.output(0, x.shape, &out));
    auto in = x.span<float>();
    for (int64_t i = 0; i < out.size; ++i) out[i] = 2.f * in[i];
    return Status::OK();
  }
};
}  // namespace
extern const KernelDef kernel_mmdeploy_op_p33b_twice = make_kernel<Twice>();
}  // namespace opbridge
