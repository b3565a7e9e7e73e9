// mydomain::testgroupnorm: the ONNX custom-op tutorial's group norm, the node its symbolic registered for
// mynamespace::custom_group_norm writes (g.op("mydomain::testgroupnorm", X, num_groups, scale, bias,
// epsilon_f=0.); tests/test_registered_symbolics.py). Each sample's channels in num_groups groups are
// normalized over the group's channels and positions, then scaled and shifted per channel.
#include <cmath>
#include <vector>

#include "opbridge_kernel.h"
namespace opbridge {
namespace {
struct GroupNorm {
  float epsilon = 0.f;
  static Status Read(const Attributes& attrs, GroupNorm* self) { return attrs.get("epsilon", &self->epsilon); }
  Status Compute(Context& ctx) const {
    const TensorView& x = ctx.input(0);
    const TensorView& groups = ctx.input(1);
    const TensorView& scale = ctx.input(2);
    const TensorView& bias = ctx.input(3);
    for (const TensorView* t : {&x, &groups, &scale, &bias})
      if (t->dtype != DType::kFloat) return Fail("every input must be float32, got ", dtype_name(t->dtype));
    if (x.shape.size() < 2) return Fail("input 'X' must be (N, C, ...), got ", shape_str(x.shape));
    if (groups.numel() < 1) return Fail("input 'num_groups' must hold the group count, got ", shape_str(groups.shape));
    const int64_t n = x.shape[0], c = x.shape[1], inner = c == 0 || n == 0 ? 0 : x.numel() / (n * c);
    const int64_t g = static_cast<int64_t>(groups.span<float>()[0]);
    if (g < 1 || c % g != 0) return Fail("input 'num_groups' must divide the ", c, " channels, got ", g);
    if (scale.numel() != c || bias.numel() != c)
      return Fail("inputs 'scale' and 'bias' must hold one value per channel (", c, "), got ", shape_str(scale.shape),
                  " and ", shape_str(bias.shape));
    Span<float> out;
    OPBRIDGE_RETURN_IF_ERROR(ctx.output(0, x.shape, &out));
    auto in = x.span<float>();
    auto s = scale.span<float>(), b = bias.span<float>();
    const int64_t per = c / g * inner;
    for (int64_t i = 0; i < n * g; ++i) {
      const float* src = &in[i * per];
      double sum = 0, sq = 0;
      for (int64_t k = 0; k < per; ++k) sum += src[k], sq += double(src[k]) * src[k];
      const double mean = sum / per, var = sq / per - mean * mean;
      const double inv = 1.0 / std::sqrt(var + epsilon);
      for (int64_t k = 0; k < per; ++k) {
        const int64_t ch = (i % g) * (c / g) + k / inner;
        out[i * per + k] = static_cast<float>((src[k] - mean) * inv * s[ch] + b[ch]);
      }
    }
    return Status::OK();
  }
};
}  // namespace
extern const KernelDef kernel_mydomain_op_testgroupnorm = make_kernel<GroupNorm>();
}  // namespace opbridge
