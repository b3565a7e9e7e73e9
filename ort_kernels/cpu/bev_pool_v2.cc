// bev::bev_pool_v2 — BEVDet voxel pooling. Mirrors custom_ops/bev_pool_v2.py:
//   out[b, c, z, y, x] = sum over intervals i with ranks_bev[starts[i]] = cell(b, z, y, x),
//                        points p in [starts[i], starts[i] + lengths[i]):
//                        depth.flat[ranks_depth[p]] * feat.rows(C)[ranks_feat[p]][c]
// float16 accumulates in float32, float32 in float32, float64 in float64.
#include <algorithm>
#include <vector>

#include "opbridge_kernel.h"

namespace opbridge {
namespace {

// Storage type -> (accumulator type, load/store).
template <typename T> struct Num;
template <> struct Num<float> {
  using Acc = float;
  static float load(float v) { return v; }
  static float store(float v) { return v; }
};
template <> struct Num<double> {
  using Acc = double;
  static double load(double v) { return v; }
  static double store(double v) { return v; }
};
template <> struct Num<uint16_t> {  // float16 bits
  using Acc = float;
  static float load(uint16_t v) { return half_to_float(v); }
  static uint16_t store(float v) { return float_to_half(v); }
};

struct Indices {
  Span<const int32_t> ranks_depth, ranks_feat, ranks_bev, interval_starts, interval_lengths;
};

Status check_range(Span<const int32_t> v, const char* name, int64_t limit, const char* what) {
  for (int64_t i = 0; i < v.size; ++i) {
    if (v[i] < 0 || v[i] >= limit)
      return Fail("input '", name, "' has value ", v[i], " at position ", i, ", outside [0, ", limit, ") (",
                  what, ")");
  }
  return Status::OK();
}

// Every index is checked before any memory is read through it.
Status validate(const Indices& ix, int64_t depth_numel, int64_t feat_rows, int64_t n_cells) {
  const int64_t points = ix.ranks_depth.size;
  if (ix.ranks_feat.size != points || ix.ranks_bev.size != points)
    return Fail("inputs 'ranks_depth', 'ranks_feat', 'ranks_bev' must have one entry per point, got lengths ",
                points, ", ", ix.ranks_feat.size, ", ", ix.ranks_bev.size);
  if (ix.interval_starts.size != ix.interval_lengths.size)
    return Fail("inputs 'interval_starts' and 'interval_lengths' must have equal length, got ",
                ix.interval_starts.size, " and ", ix.interval_lengths.size);
  OPBRIDGE_RETURN_IF_ERROR(check_range(ix.ranks_depth, "ranks_depth", depth_numel, "depth elements"));
  OPBRIDGE_RETURN_IF_ERROR(check_range(ix.ranks_feat, "ranks_feat", feat_rows, "feat rows B*N*H*W"));
  OPBRIDGE_RETURN_IF_ERROR(check_range(ix.ranks_bev, "ranks_bev", n_cells, "BEV cells B*Z*Y*X"));
  for (int64_t i = 0; i < ix.interval_lengths.size; ++i) {
    const int64_t start = ix.interval_starts[i], length = ix.interval_lengths[i];
    if (length < 0) return Fail("input 'interval_lengths' has value ", length, " at position ", i, ", must be >= 0");
    if (start < 0 || start + length > points)
      return Fail("interval ", i, " = [", start, ", ", start + length, ") (inputs 'interval_starts', "
                  "'interval_lengths') lies outside the ", points, " points");
  }
  return Status::OK();
}

// Sum of one interval's points into acc[0..C).
template <typename T, typename A>
inline void pool_interval(const T* depth, const T* feat, int64_t channels, const Indices& ix, int64_t start,
                          int64_t length, A* acc) {
  std::fill(acc, acc + channels, A(0));
  for (int64_t p = start; p < start + length; ++p) {
    const A d = Num<T>::load(depth[ix.ranks_depth[p]]);
    const T* row = feat + static_cast<int64_t>(ix.ranks_feat[p]) * channels;
    for (int64_t c = 0; c < channels; ++c) acc[c] += d * Num<T>::load(row[c]);
  }
}

template <typename T>
void bev_pool_v2(Span<const T> depth, Span<const T> feat, const Indices& ix, const std::vector<int64_t>& bev_shape,
                 Span<T> out, Context& ctx) {
  using A = typename Num<T>::Acc;
  const int64_t channels = bev_shape[4];
  const int64_t zyx = bev_shape[1] * bev_shape[2] * bev_shape[3];
  const int64_t n_cells = bev_shape[0] * zyx;
  const int64_t intervals = ix.interval_starts.size;
  // NOTE: output layout is (B, C, Z, Y, X): a cell's C values are zyx apart.
  std::fill(out.begin(), out.end(), Num<T>::store(A(0)));
  std::vector<uint8_t> seen(static_cast<size_t>(n_cells), 0);
  bool unique = true;
  for (int64_t i = 0; i < intervals && unique; ++i) {
    if (ix.interval_lengths[i] == 0) continue;
    uint8_t& s = seen[ix.ranks_bev[ix.interval_starts[i]]];
    unique = !s;
    s = 1;
  }
  if (unique) {  // BEVDet's case: one interval per cell, so intervals write disjoint cells in parallel
    ctx.parallel_for(intervals, 16, [&](int64_t begin, int64_t end) {
      std::vector<A> acc(static_cast<size_t>(channels));
      for (int64_t i = begin; i < end; ++i) {
        const int64_t length = ix.interval_lengths[i];
        if (length == 0) continue;
        const int64_t start = ix.interval_starts[i];
        pool_interval(depth.data, feat.data, channels, ix, start, length, acc.data());
        const int64_t cell = ix.ranks_bev[start];
        T* o = out.data + (cell / zyx) * channels * zyx + cell % zyx;
        for (int64_t c = 0; c < channels; ++c) o[c * zyx] = Num<T>::store(acc[c]);
      }
    });
    return;
  }
  // Several intervals share a cell: sum serially in the accumulator type (deterministic), then store.
  std::vector<A> total(static_cast<size_t>(n_cells * channels), A(0));
  std::vector<A> acc(static_cast<size_t>(channels));
  for (int64_t i = 0; i < intervals; ++i) {
    const int64_t length = ix.interval_lengths[i];
    if (length == 0) continue;
    const int64_t start = ix.interval_starts[i];
    pool_interval(depth.data, feat.data, channels, ix, start, length, acc.data());
    A* t = total.data() + static_cast<int64_t>(ix.ranks_bev[start]) * channels;
    for (int64_t c = 0; c < channels; ++c) t[c] += acc[c];
  }
  for (int64_t cell = 0; cell < n_cells; ++cell)
    for (int64_t c = 0; c < channels; ++c)
      out[(cell / zyx) * channels * zyx + c * zyx + cell % zyx] = Num<T>::store(total[cell * channels + c]);
}

struct BevPoolV2 {
  std::vector<int64_t> bev_feat_shape;  // [B, Z, Y, X, C]

  static Status Read(const Attributes& attrs, BevPoolV2* self) {
    OPBRIDGE_RETURN_IF_ERROR(attrs.get("bev_feat_shape", &self->bev_feat_shape));
    const auto& s = self->bev_feat_shape;
    if (s.size() != 5 || *std::min_element(s.begin(), s.end()) < 0)
      return Fail("attribute 'bev_feat_shape' must be 5 sizes [B, Z, Y, X, C] >= 0, got ", shape_str(s));
    return Status::OK();
  }

  Status Compute(Context& ctx) const {
    const TensorView& depth = ctx.input(0);
    const TensorView& feat = ctx.input(1);
    OPBRIDGE_RETURN_IF_ERROR(expect_rank(depth, "depth", 5));
    OPBRIDGE_RETURN_IF_ERROR(expect_rank(feat, "feat", 5));
    static const char* kIndexNames[] = {"ranks_depth", "ranks_feat", "ranks_bev", "interval_starts",
                                        "interval_lengths"};
    for (int i = 0; i < 5; ++i) OPBRIDGE_RETURN_IF_ERROR(expect_rank(ctx.input(2 + i), kIndexNames[i], 1));
    const auto& s = bev_feat_shape;
    if (feat.shape[4] != s[4])
      return Fail("attribute 'bev_feat_shape' C = ", s[4], " must equal feat.shape[4] = ", feat.shape[4],
                  " (feat shape ", shape_str(feat.shape), ")");
    Indices ix{ctx.input(2).span<int32_t>(), ctx.input(3).span<int32_t>(), ctx.input(4).span<int32_t>(),
               ctx.input(5).span<int32_t>(), ctx.input(6).span<int32_t>()};
    const int64_t feat_rows = feat.shape[0] * feat.shape[1] * feat.shape[2] * feat.shape[3];
    OPBRIDGE_RETURN_IF_ERROR(validate(ix, depth.numel(), feat_rows, s[0] * s[1] * s[2] * s[3]));
    const std::vector<int64_t> out_shape{s[0], s[4], s[1], s[2], s[3]};
    switch (feat.dtype) {
      case DType::kFloat: return run<float>(ctx, depth, feat, ix, out_shape);
      case DType::kDouble: return run<double>(ctx, depth, feat, ix, out_shape);
      case DType::kFloat16: return run<uint16_t>(ctx, depth, feat, ix, out_shape);
      default: return Fail("inputs 'depth'/'feat' have unsupported dtype ", dtype_name(feat.dtype));
    }
  }

  template <typename T>
  Status run(Context& ctx, const TensorView& depth, const TensorView& feat, const Indices& ix,
             const std::vector<int64_t>& out_shape) const {
    Span<T> out;
    OPBRIDGE_RETURN_IF_ERROR(ctx.output(0, out_shape, &out));
    bev_pool_v2<T>(depth.span<T>(), feat.span<T>(), ix, bev_feat_shape, out, ctx);
    return Status::OK();
  }
};

}  // namespace

extern const KernelDef kernel_bev_pool_v2 = make_kernel<BevPoolV2>();

}  // namespace opbridge
