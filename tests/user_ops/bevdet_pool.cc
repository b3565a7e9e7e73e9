// BEVDet's voxel pooling as its two torch.autograd.Functions' nodes (tests/test_functions.py), one
// algorithm for both:
//   mmdeploy::bev_pool_v2 (TRTBEVPoolv2's symbolic; attributes out_height, out_width) -> [1, H, W, C]
//   bevdet::QuickCumsum (QuickCumsumCuda, no symbolic; attribute bev_feat_shape [B, Z, Y, X, C]) -> that shape
// For each interval i, every point p in [interval_starts[i], interval_starts[i] + interval_lengths[i])
// adds depth.flat[ranks_depth[p]] * feat.rows(C)[ranks_feat[p]] into the cell ranks_bev[interval_starts[i]]
// (cells in output order, C channels each). depth and feat are float32 or float64 (the Functions
// compute in float32, as the output is); the five index inputs int32 or int64, 1-D. Every index is
// checked before the output is written: a bad one is an error naming it, never a read out of bounds.
#include <cstdint>
#include <vector>

#include "opbridge_kernel.h"

namespace opbridge {
namespace {

constexpr const char* kIndexNames[5] = {"ranks_depth", "ranks_feat", "ranks_bev", "interval_starts",
                                        "interval_lengths"};

Status read_indices(const TensorView& t, const char* name, std::vector<int64_t>* out) {
  OPBRIDGE_RETURN_IF_ERROR(expect_rank(t, name, 1));
  out->resize(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::kInt32) {
    auto s = t.span<int32_t>();
    for (int64_t i = 0; i < s.size; ++i) (*out)[static_cast<size_t>(i)] = s[i];
  } else if (t.dtype == DType::kInt64) {
    auto s = t.span<int64_t>();
    for (int64_t i = 0; i < s.size; ++i) (*out)[static_cast<size_t>(i)] = s[i];
  } else {
    return Fail("input '", name, "' must be int32 or int64, got ", dtype_name(t.dtype));
  }
  return Status::OK();
}

Status check_within(const std::vector<int64_t>& values, const char* name, int64_t bound, const char* of) {
  for (size_t i = 0; i < values.size(); ++i)
    if (values[i] < 0 || values[i] >= bound)
      return Fail("input '", name, "' has value ", values[i], " at position ", i, ", outside [0, ", bound, ") (", of, ")");
  return Status::OK();
}

template <typename T>
void pool(const TensorView& depth, const TensorView& feat, int64_t channels, const std::vector<int64_t>* idx,
          float* out) {
  const T* d = depth.span<T>().data;
  const T* f = feat.span<T>().data;
  const std::vector<int64_t>&rd = idx[0], &rf = idx[1], &rb = idx[2], &starts = idx[3], &lengths = idx[4];
  for (size_t i = 0; i < starts.size(); ++i) {
    if (lengths[i] == 0) continue;
    float* cell = out + rb[static_cast<size_t>(starts[i])] * channels;
    for (int64_t p = starts[i]; p < starts[i] + lengths[i]; ++p) {
      const float w = static_cast<float>(d[rd[static_cast<size_t>(p)]]);
      const T* row = f + rf[static_cast<size_t>(p)] * channels;
      for (int64_t c = 0; c < channels; ++c) cell[c] += static_cast<float>(row[c]) * w;
    }
  }
}

// Checks the inputs against `cells` output cells, then writes the pooled output of `shape`.
Status run_pool(Context& ctx, const std::vector<int64_t>& shape, int64_t cells) {
  const TensorView& depth = ctx.input(0);
  const TensorView& feat = ctx.input(1);
  if (depth.dtype != feat.dtype || (depth.dtype != DType::kFloat && depth.dtype != DType::kDouble))
    return Fail("inputs 'depth' and 'feat' must both be float32 or both float64, got ", dtype_name(depth.dtype),
                " and ", dtype_name(feat.dtype));
  OPBRIDGE_RETURN_IF_ERROR(expect_min_rank(feat, "feat", 1));
  const int64_t channels = feat.shape.back();
  if (channels != shape.back())
    return Fail("input 'feat' has ", channels, " channels (last dim), the output ", shape.back());
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < feat.shape.size(); ++i) rows *= feat.shape[i];
  std::vector<int64_t> idx[5];
  for (int i = 0; i < 5; ++i) OPBRIDGE_RETURN_IF_ERROR(read_indices(ctx.input(2 + i), kIndexNames[i], &idx[i]));
  const int64_t points = static_cast<int64_t>(idx[0].size());
  if (static_cast<int64_t>(idx[1].size()) != points || static_cast<int64_t>(idx[2].size()) != points)
    return Fail("ranks_depth, ranks_feat and ranks_bev must have one entry per point, got lengths ", points, ", ",
                idx[1].size(), " and ", idx[2].size());
  if (idx[3].size() != idx[4].size())
    return Fail("interval_starts and interval_lengths must have one entry per interval, got lengths ",
                idx[3].size(), " and ", idx[4].size());
  OPBRIDGE_RETURN_IF_ERROR(check_within(idx[0], "ranks_depth", depth.numel(), "depth's elements"));
  OPBRIDGE_RETURN_IF_ERROR(check_within(idx[1], "ranks_feat", rows, "feat's rows"));
  OPBRIDGE_RETURN_IF_ERROR(check_within(idx[2], "ranks_bev", cells, "the output's cells"));
  for (size_t i = 0; i < idx[3].size(); ++i) {
    const int64_t start = idx[3][i], length = idx[4][i];
    if (start < 0 || length < 0 || length > points || start > points - length)
      return Fail("interval ", i, " (start ", start, ", length ", length, ") is not within the ", points,
                  " points");
  }
  Span<float> out;
  OPBRIDGE_RETURN_IF_ERROR(ctx.output(0, shape, &out));
  for (int64_t i = 0; i < out.size; ++i) out[i] = 0.f;
  if (depth.dtype == DType::kFloat)
    pool<float>(depth, feat, channels, idx, out.data);
  else
    pool<double>(depth, feat, channels, idx, out.data);
  return Status::OK();
}

struct BevPoolV2 {  // mmdeploy::bev_pool_v2
  int64_t out_height = 0, out_width = 0;
  static Status Read(const Attributes& attrs, BevPoolV2* self) {
    OPBRIDGE_RETURN_IF_ERROR(attrs.get("out_height", &self->out_height));
    OPBRIDGE_RETURN_IF_ERROR(attrs.get("out_width", &self->out_width));
    if (self->out_height < 0 || self->out_width < 0 || self->out_height > (int64_t{1} << 30) ||
        self->out_width > (int64_t{1} << 30))
      return Fail("attributes 'out_height' and 'out_width' must be in [0, 2**30], got ", self->out_height, " and ",
                  self->out_width);
    return Status::OK();
  }
  Status Compute(Context& ctx) const {
    const TensorView& feat = ctx.input(1);
    OPBRIDGE_RETURN_IF_ERROR(expect_min_rank(feat, "feat", 1));
    return run_pool(ctx, {1, out_height, out_width, feat.shape.back()}, out_height * out_width);
  }
};

struct QuickCumsum {  // bevdet::QuickCumsum
  std::vector<int64_t> shape;
  int64_t cells = 1;
  static Status Read(const Attributes& attrs, QuickCumsum* self) {
    OPBRIDGE_RETURN_IF_ERROR(attrs.get("bev_feat_shape", &self->shape));
    if (self->shape.size() != 5) return Fail("attribute 'bev_feat_shape' must be [B, Z, Y, X, C], got ",
                                             shape_str(self->shape));
    int64_t elements = 1;
    for (int64_t d : self->shape) {
      if (d < 0 || d > (int64_t{1} << 30) || (d > 0 && elements > (int64_t{1} << 40) / d))
        return Fail("attribute 'bev_feat_shape' must be sizes >= 0 of at most 2**40 elements, got ",
                    shape_str(self->shape));
      elements *= d;
    }
    for (size_t i = 0; i < 4; ++i) self->cells *= self->shape[i];
    return Status::OK();
  }
  Status Compute(Context& ctx) const { return run_pool(ctx, shape, cells); }
};

}  // namespace

extern const KernelDef kernel_mmdeploy_op_bev_pool_v2 = make_kernel<BevPoolV2>();
extern const KernelDef kernel_bevdet_op_QuickCumsum = make_kernel<QuickCumsum>();

}  // namespace opbridge
