// bev::bev_pool_v2 — BEVDet voxel pooling. Mirrors custom_ops/bev_pool_v2.py:
//   out[b, c, z, y, x] = sum over intervals i with ranks_bev[starts[i]] = cell(b, z, y, x),
//                        points p in [starts[i], starts[i] + lengths[i]):
//                        depth.flat[ranks_depth[p]] * feat.rows(C)[ranks_feat[p]][c]
// float16 accumulates in float32, float32 in float32, float64 in float64.
//
// The pass: parallel tasks, each owning a contiguous range of cells; a task sums its intervals
// into a cache-sized tile (a row of C contiguous channels per cell), then writes the tile into the
// (B, C, Z, Y, X) output one contiguous channel run at a time, L x L blocks transposed in registers.
// Every output element is written exactly once (empty cells as zeros). Three cases:
// 1. what voxel_pooling_prepare_v2 produces (cells of the non-empty intervals strictly increase,
//    intervals partition the points): one parallel section, each task checking its own intervals
//    and the ranks of its points before reading through them;
// 2. sorted cells, intervals not a partition: validated serially first, then the same pass;
// 3. a cell shared by several intervals, or cells out of order: validated first, summed serially
//    per cell in the accumulator type (deterministic), then written out.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <thread>
#include <type_traits>
#include <vector>

#include "opbridge_kernel.h"

// NOTE: the hot loops are compiled twice and picked per call by the CPU they run on: an AVX2
// version (32-byte vectors) and the baseline (16-byte vectors: SSE2, or NEON elsewhere). The
// library stays deployable on any CPU, so no -march=native. (GCC's target_clones gave the
// baseline clone the same 32-byte vectors, which SSE2 spills to the stack: 4x slower than this.)
// The sorted path's pooling has a third, AVX-512 version (64-byte vectors; 32-byte transposes):
// half the loads and multiply-adds to issue per point, ~5% faster per call at BEVDet-R50 size on AMD Zen 4.
// Every version sums each channel in the same order, with a multiply and an add rounded apart (the
// library is built with -ffp-contract=off, ort_kernels/build.py): their results are bitwise equal.
// Both x86 versions also enable PREFETCHW (prefetch with intent to write, see pool_sorted_task),
// not a condition of the dispatch: every x86-64 CPU with AVX2 runs it (Intel before Broadwell,
// which lack its CPUID bit, run it as a no-op), and the baseline's write prefetch is a plain prefetch.
// Which version runs is opbridge::isa() (opbridge_kernel.h): $OPBRIDGE_ISA caps it at run time,
// -DOPBRIDGE_BASELINE_ONLY / -DOPBRIDGE_NO_AVX512 leave versions out of the build.
#if defined(__GNUC__)
#define OPBRIDGE_INLINE inline __attribute__((always_inline))
#define OPBRIDGE_PREFETCH(p) __builtin_prefetch(p)
#define OPBRIDGE_PREFETCH_WRITE(p) __builtin_prefetch(p, 1)
#define OPBRIDGE_PREFETCH_L2(p) __builtin_prefetch(p, 0, 2)
#else
#define OPBRIDGE_INLINE inline
#define OPBRIDGE_PREFETCH(p) ((void)0)
#define OPBRIDGE_PREFETCH_WRITE(p) ((void)0)
#define OPBRIDGE_PREFETCH_L2(p) ((void)0)
#endif

namespace opbridge {
namespace {

// Storage type -> (accumulator type, store).
template <typename T> struct Num;
template <> struct Num<float> {
  using Acc = float;
  static float store(float v) { return v; }
};
template <> struct Num<double> {
  using Acc = double;
  static double store(double v) { return v; }
};
template <> struct Num<uint16_t> {  // float16 bits: inputs are converted once up front
  using Acc = float;
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

// Every index is checked before any memory is read through it. The serial reference check: the
// fast path runs the same checks inside its pass and comes here only to name the first bad value.
Status validate(const Indices& ix, int64_t depth_numel, int64_t feat_rows, int64_t n_cells) {
  const int64_t points = ix.ranks_depth.size;
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

Status validate_lengths(const Indices& ix) {
  const int64_t points = ix.ranks_depth.size;
  if (ix.ranks_feat.size != points || ix.ranks_bev.size != points)
    return Fail("inputs 'ranks_depth', 'ranks_feat', 'ranks_bev' must have one entry per point, got lengths ",
                points, ", ", ix.ranks_feat.size, ", ", ix.ranks_bev.size);
  if (ix.interval_starts.size != ix.interval_lengths.size)
    return Fail("inputs 'interval_starts' and 'interval_lengths' must have equal length, got ",
                ix.interval_starts.size, " and ", ix.interval_lengths.size);
  return Status::OK();
}

// v in [0, limit) for an int32 v: one unsigned compare (a negative v wraps to >= 2^31).
OPBRIDGE_INLINE uint32_t u32_limit(int64_t limit) {
  return static_cast<uint32_t>(std::min<int64_t>(limit, int64_t{1} << 31));
}

// Everything one pass over the intervals needs; A is the accumulator type, Out the output's storage.
template <typename A, typename Out>
struct Job {
  const A* depth;
  const A* feat;
  const int32_t *rd, *rf, *rb, *starts, *lengths;
  int64_t channels, zyx, n_cells;
  uint32_t depth_limit, feat_limit, cell_limit;
  int64_t points, intervals;
  bool trusted;  // intervals and ranks validated up front (else each task checks its own)
  Out* out;
};

// NOTE: scratch tile of 16 KiB (half of L1d): up to kTile cells x a chunk of channels (all C when
// C <= 512 float32 / 256 float64).
constexpr int64_t kScratchBytes = 16 * 1024;
constexpr int64_t kTile = 64;

// The tile's geometry: channels per chunk, cells per tile (chunk x cells fits the scratch).
template <typename A>
int64_t chunk_of(int64_t channels) {
  return std::min<int64_t>(channels, kScratchBytes / static_cast<int64_t>(sizeof(A)) / 8);
}
template <typename A>
int64_t tile_cells_of(int64_t chunk) {
  return std::min<int64_t>(kTile, kScratchBytes / static_cast<int64_t>(sizeof(A)) / chunk);
}

// NOTE: the sums are held in GCC/Clang vector types of W bytes (32: AVX2 registers, 16: SSE/NEON):
// the auto-vectorizer keeps an array of per-channel sums in memory and does not vectorize it across
// channels, while vector types compile to one vector multiply and add per W bytes of channels.
#if defined(__GNUC__)
#define OPBRIDGE_VECTOR 1
template <typename A, int W> struct Vec {  // W bytes
  typedef A V __attribute__((vector_size(W)));
  typedef A Unaligned __attribute__((vector_size(W), aligned(sizeof(A)), may_alias));
  static constexpr int kLanes = W / sizeof(A);
};
#define OPBRIDGE_VLOAD(A, W, p) (*reinterpret_cast<const typename Vec<A, W>::Unaligned*>(p))
// NOTE: a vector the compiler must treat as computed: a loop copying vectors through it stays inline
// vector moves instead of becoming a memcpy call (one call per 256-byte channel run cost ~5% of a
// call at BEVDet-R50 size).
#if defined(__x86_64__) || (defined(__i386__) && defined(__SSE2__))
#define OPBRIDGE_OPAQUE(v) asm("" : "+x"(v))
#elif defined(__aarch64__)
#define OPBRIDGE_OPAQUE(v) asm("" : "+w"(v))
#else
#define OPBRIDGE_OPAQUE(v) ((void)0)
#endif
#define OPBRIDGE_VREF(A, W, p) (*reinterpret_cast<typename Vec<A, W>::Unaligned*>(p))
#if defined(__clang__)
#define OPBRIDGE_SHUFFLE(a, b, Mask, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define OPBRIDGE_SHUFFLE(a, b, Mask, ...) __builtin_shuffle(a, b, Mask{__VA_ARGS__})
#endif
#else
#define OPBRIDGE_VECTOR 0
template <typename A, int W> struct Vec {  // one lane: plain scalar code
  typedef A V;
  static constexpr int kLanes = 1;
};
#define OPBRIDGE_VLOAD(A, W, p) (*(p))
#define OPBRIDGE_VREF(A, W, p) (*(p))
#define OPBRIDGE_OPAQUE(v) ((void)0)
#endif

// NOTE: while point p is summed, the depth value of point p + kPrefetch is requested (depth values
// are read once each, from all over depth). Only points whose indices were already checked are
// prefetched: the `ahead` points from the interval's start. The feat rows are not: each is read ~59
// times (once per depth bin) and mostly found in L2, and requesting a row's lines cost more load
// slots than the misses it saved (BEVDet-R50 size, 1 thread, AMD Zen 5: 0.74 -> 0.67 ms per call
// with caches warm, 1.29 -> 1.16 ms after 64 MB of other traffic; the pooling loop alone, with
// every index pointing into L1, runs at the same speed: it is bound by the core, not by memory).
constexpr int64_t kPrefetch = 32;

// dst[0 .. K vectors) (=, or += when kAdd) the sum over the interval's points of depth * feat row,
// for the channels starting at feat_col. K is fixed at compile time so the sums stay in registers.
template <int K, bool kAdd, int W, typename A>
OPBRIDGE_INLINE void pool_block(const A* depth, const A* feat_col, int64_t channels, const int32_t* rd,
                                const int32_t* rf, int64_t length, int64_t ahead, A* dst) {
  constexpr int L = Vec<A, W>::kLanes;
  typename Vec<A, W>::V acc[K];
  for (int k = 0; k < K; ++k) acc[k] = typename Vec<A, W>::V{};
  // NOTE: the row address is formed in bytes from a loop-invariant base so each load is one
  // base + index + displacement operand (integer element offsets cost an extra add per load).
  const char* base = reinterpret_cast<const char*>(feat_col);
  const int64_t row_bytes = channels * static_cast<int64_t>(sizeof(A));
  for (int64_t p = 0; p < length; ++p) {
    if (p + kPrefetch < ahead) OPBRIDGE_PREFETCH(depth + rd[p + kPrefetch]);
    const A d = depth[rd[p]];
    const A* row = reinterpret_cast<const A*>(base + rf[p] * row_bytes);
    for (int k = 0; k < K; ++k) acc[k] += d * OPBRIDGE_VLOAD(A, W, row + k * L);
  }
  for (int k = 0; k < K; ++k) {
    if (kAdd) OPBRIDGE_VREF(A, W, dst + k * L) += acc[k];
    else OPBRIDGE_VREF(A, W, dst + k * L) = acc[k];
  }
}

// The same for one channel (the tail when C is not a multiple of the vector width).
template <bool kAdd, typename A>
OPBRIDGE_INLINE void pool_one(const A* depth, const A* feat_col, int64_t channels, const int32_t* rd,
                              const int32_t* rf, int64_t length, A* dst) {
  A acc = A(0);
  for (int64_t p = 0; p < length; ++p) acc += depth[rd[p]] * feat_col[static_cast<int64_t>(rf[p]) * channels];
  *dst = kAdd ? *dst + acc : acc;
}

// Channels [c0, c0 + n) of one interval into dst[0 .. n): blocks of 8, 4, 2, 1 vectors, then single channels.
template <bool kAdd, int W, typename A>
OPBRIDGE_INLINE void pool_channels(const A* depth, const A* feat, int64_t channels, const int32_t* rd,
                                   const int32_t* rf, int64_t length, int64_t ahead, int64_t c0, int64_t n, A* dst) {
  constexpr int64_t L = Vec<A, W>::kLanes;
  int64_t c = 0;
  for (; c + 8 * L <= n; c += 8 * L)
    pool_block<8, kAdd, W>(depth, feat + c0 + c, channels, rd, rf, length, ahead, dst + c);
  if (n - c >= 4 * L) {
    pool_block<4, kAdd, W>(depth, feat + c0 + c, channels, rd, rf, length, ahead, dst + c);
    c += 4 * L;
  }
  if (n - c >= 2 * L) {
    pool_block<2, kAdd, W>(depth, feat + c0 + c, channels, rd, rf, length, ahead, dst + c);
    c += 2 * L;
  }
  if (n - c >= L) {
    pool_block<1, kAdd, W>(depth, feat + c0 + c, channels, rd, rf, length, ahead, dst + c);
    c += L;
  }
  for (; c < n; ++c) pool_one<kAdd>(depth, feat + c0 + c, channels, rd, rf, length, dst + c);
}

// An L x L block, in registers: row i of src (src + i * src_stride, L values) becomes value i of
// every run dst + c * dst_stride (L = W / sizeof(A) lanes). Defined for the vector types only.
template <int W, typename A>
struct Transpose;
#if OPBRIDGE_VECTOR
template <>
struct Transpose<32, float> {
  OPBRIDGE_INLINE static void block(const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
    typedef int32_t M __attribute__((vector_size(32)));
    typename Vec<float, 32>::V r[8], t[8], u[8];
    for (int i = 0; i < 8; ++i) r[i] = OPBRIDGE_VLOAD(float, 32, src + i * src_stride);
    for (int i = 0; i < 8; i += 2) {  // interleave row pairs within each 128-bit half
      t[i] = OPBRIDGE_SHUFFLE(r[i], r[i + 1], M, 0, 8, 1, 9, 4, 12, 5, 13);
      t[i + 1] = OPBRIDGE_SHUFFLE(r[i], r[i + 1], M, 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int i = 0; i < 8; i += 4) {  // then pairs of pairs: 4 rows of a channel in each half
      u[i] = OPBRIDGE_SHUFFLE(t[i], t[i + 2], M, 0, 1, 8, 9, 4, 5, 12, 13);
      u[i + 1] = OPBRIDGE_SHUFFLE(t[i], t[i + 2], M, 2, 3, 10, 11, 6, 7, 14, 15);
      u[i + 2] = OPBRIDGE_SHUFFLE(t[i + 1], t[i + 3], M, 0, 1, 8, 9, 4, 5, 12, 13);
      u[i + 3] = OPBRIDGE_SHUFFLE(t[i + 1], t[i + 3], M, 2, 3, 10, 11, 6, 7, 14, 15);
    }
    for (int c = 0; c < 4; ++c) {  // then the halves: rows 0-3 and 4-7
      OPBRIDGE_VREF(float, 32, dst + c * dst_stride) = OPBRIDGE_SHUFFLE(u[c], u[c + 4], M, 0, 1, 2, 3, 8, 9, 10, 11);
      OPBRIDGE_VREF(float, 32, dst + (c + 4) * dst_stride) =
          OPBRIDGE_SHUFFLE(u[c], u[c + 4], M, 4, 5, 6, 7, 12, 13, 14, 15);
    }
  }
};
template <>
struct Transpose<32, double> {
  OPBRIDGE_INLINE static void block(const double* src, int64_t src_stride, double* dst, int64_t dst_stride) {
    typedef int64_t M __attribute__((vector_size(32)));
    typename Vec<double, 32>::V r[4], t[4];
    for (int i = 0; i < 4; ++i) r[i] = OPBRIDGE_VLOAD(double, 32, src + i * src_stride);
    for (int i = 0; i < 4; i += 2) {
      t[i] = OPBRIDGE_SHUFFLE(r[i], r[i + 1], M, 0, 4, 2, 6);
      t[i + 1] = OPBRIDGE_SHUFFLE(r[i], r[i + 1], M, 1, 5, 3, 7);
    }
    for (int c = 0; c < 2; ++c) {
      OPBRIDGE_VREF(double, 32, dst + c * dst_stride) = OPBRIDGE_SHUFFLE(t[c], t[c + 2], M, 0, 1, 4, 5);
      OPBRIDGE_VREF(double, 32, dst + (c + 2) * dst_stride) = OPBRIDGE_SHUFFLE(t[c], t[c + 2], M, 2, 3, 6, 7);
    }
  }
};
template <>
struct Transpose<16, float> {
  OPBRIDGE_INLINE static void block(const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
    typedef int32_t M __attribute__((vector_size(16)));
    typename Vec<float, 16>::V r[4], t[4];
    for (int i = 0; i < 4; ++i) r[i] = OPBRIDGE_VLOAD(float, 16, src + i * src_stride);
    for (int i = 0; i < 4; i += 2) {
      t[i] = OPBRIDGE_SHUFFLE(r[i], r[i + 1], M, 0, 4, 1, 5);
      t[i + 1] = OPBRIDGE_SHUFFLE(r[i], r[i + 1], M, 2, 6, 3, 7);
    }
    for (int c = 0; c < 2; ++c) {
      OPBRIDGE_VREF(float, 16, dst + 2 * c * dst_stride) = OPBRIDGE_SHUFFLE(t[c], t[c + 2], M, 0, 1, 4, 5);
      OPBRIDGE_VREF(float, 16, dst + (2 * c + 1) * dst_stride) = OPBRIDGE_SHUFFLE(t[c], t[c + 2], M, 2, 3, 6, 7);
    }
  }
};
template <>
struct Transpose<16, double> {
  OPBRIDGE_INLINE static void block(const double* src, int64_t src_stride, double* dst, int64_t dst_stride) {
    typedef int64_t M __attribute__((vector_size(16)));
    const typename Vec<double, 16>::V r0 = OPBRIDGE_VLOAD(double, 16, src);
    const typename Vec<double, 16>::V r1 = OPBRIDGE_VLOAD(double, 16, src + src_stride);
    OPBRIDGE_VREF(double, 16, dst) = OPBRIDGE_SHUFFLE(r0, r1, M, 0, 2);
    OPBRIDGE_VREF(double, 16, dst + dst_stride) = OPBRIDGE_SHUFFLE(r0, r1, M, 1, 3);
  }
};
#endif

// A row-major tile (cells x n channels, row stride ld) into the output's channel planes (plane stride
// zyx): every channel becomes one contiguous run of `cells` values. NOTE: writing a cell's channels
// directly (zyx apart) thrashes L1 sets; this transposes L x L blocks in registers into `stage` (an
// L1 buffer, channel-major) and then copies each channel's run out whole. NOTE: the planes are
// 64 KiB apart at BEVDet size (128 x 128 cells), so the runs of a tile land in the same few cache
// sets: writing them one run after another rather than the transposed blocks' 8 planes at a time
// (8 runs growing together) measured 0.37 -> 0.28 ms for the output of BEVDet-R50 on one core with
// the output in cache (the whole call ~3% faster when other work shares the caches).
template <int W, typename A, typename Out>
OPBRIDGE_INLINE void write_tile(const A* tile, int64_t ld, int64_t n, int64_t cells, Out* out, int64_t zyx,
                                A* stage) {
  constexpr int64_t L = Vec<A, W>::kLanes;
  if constexpr (std::is_same<A, Out>::value && L > 1) {
    int64_t c = 0;
    for (; c + L <= n; c += L) {
      int64_t r = 0;
      for (; r + L <= cells; r += L) Transpose<W, A>::block(tile + r * ld + c, ld, stage + c * cells + r, cells);
      for (; r < cells; ++r)
        for (int64_t q = c; q < c + L; ++q) stage[q * cells + r] = tile[r * ld + q];
    }
    for (; c < n; ++c)
      for (int64_t r = 0; r < cells; ++r) stage[c * cells + r] = tile[r * ld + c];
    for (c = 0; c < n; ++c) {
      const A* from = stage + c * cells;
      A* to = out + c * zyx;
      int64_t r = 0;
      for (; r + L <= cells; r += L) {
        typename Vec<A, W>::V v = OPBRIDGE_VLOAD(A, W, from + r);
        OPBRIDGE_OPAQUE(v);
        OPBRIDGE_VREF(A, W, to + r) = v;
      }
      for (; r < cells; ++r) to[r] = from[r];
    }
  } else {
    (void)stage;
    for (int64_t c = 0; c < n; ++c)
      for (int64_t r = 0; r < cells; ++r) out[c * zyx + r] = Num<Out>::store(tile[r * ld + c]);
  }
}

// Are all points of [begin, end) valid indices? One pass, no early exit, so it vectorizes.
template <typename A, typename Out>
OPBRIDGE_INLINE bool points_ok(const Job<A, Out>& j, int64_t begin, int64_t end) {
  uint32_t bad = 0;
  for (int64_t p = begin; p < end; ++p)
    bad |= (static_cast<uint32_t>(j.rd[p]) >= j.depth_limit) | (static_cast<uint32_t>(j.rf[p]) >= j.feat_limit) |
           (static_cast<uint32_t>(j.rb[p]) >= j.cell_limit);
  return bad == 0;
}

enum class TaskResult : uint8_t { kDone, kBadRank, kFallBack };

// Do intervals [i0, i1) partition their points (each starts where the previous one ends: the
// first where interval i0 - 1 ends, or at 0; the last task's end is the last point), with the
// cells of the non-empty ones strictly increasing inside [cell_begin, cell_end)?
template <typename A, typename Out>
OPBRIDGE_INLINE bool intervals_ok(const Job<A, Out>& j, int64_t i0, int64_t i1, int64_t cell_begin,
                                  int64_t cell_end) {
  int64_t expected = i0 == 0 ? 0 : int64_t{j.starts[i0 - 1]} + j.lengths[i0 - 1];
  int64_t last = cell_begin - 1;
  for (int64_t q = i0; q < i1; ++q) {
    const int64_t start = j.starts[q], length = j.lengths[q];
    if (start != expected || start < 0 || length < 0 || start + length > j.points) return false;
    expected = start + length;
    if (length == 0) continue;
    const int64_t cell = j.rb[start];
    if (cell <= last || cell >= cell_end) return false;
    last = cell;
  }
  return i1 < j.intervals || expected == j.points;
}

// One task of the sorted path: intervals [i0, i1), whose cells lie in [cell_begin, cell_end); writes
// every output element of those cells. Untrusted input is checked first: kFallBack when the
// intervals are not such a partition (nothing written), kBadRank when a rank is out of range.
// (WT: the vector width of the transposes, W's except in the AVX-512 version, which has none of 64 bytes.)
template <int W, typename A, typename Out, int WT = W>
OPBRIDGE_INLINE TaskResult pool_sorted_task(const Job<A, Out>& j, int64_t i0, int64_t i1, int64_t cell_begin,
                                            int64_t cell_end) {
  if (!j.trusted && !intervals_ok(j, i0, i1, cell_begin, cell_end)) return TaskResult::kFallBack;
  alignas(64) A tile[kScratchBytes / sizeof(A)];
  alignas(64) A stage[kScratchBytes / sizeof(A)];
  const int64_t channels = j.channels, zyx = j.zyx;
  const int64_t chunk = chunk_of<A>(channels), tile_cells = tile_cells_of<A>(chunk);
  int64_t i = i0;
  for (int64_t a = cell_begin; a < cell_end;) {
    // NOTE: tiles start at multiples of tile_cells in their plane (the task's first tile may be
    // shorter), so the output runs are aligned like the planes.
    const int64_t offset = a % zyx;
    const int64_t b = std::min({a + tile_cells - offset % tile_cells, cell_end, a - offset + zyx});
    const int64_t cells = b - a;
    int64_t k = i;  // intervals [i, k) hold the tile's cells (empty intervals skipped below)
    bool any = false;  // a non-empty interval among them
    for (; k < i1 && (j.lengths[k] == 0 || j.rb[j.starts[k]] < b); ++k) any = any || j.lengths[k] > 0;
    Out* out = j.out + (a / zyx) * channels * zyx + a % zyx;
    // NOTE: the tile's output lines are requested for writing now, while its intervals are summed,
    // so the channel runs written below find them owned in cache instead of each store waiting on a
    // read for ownership (copying the tile out was ~1/4 of a 1-thread call at BEVDet-R50 size;
    // ~3-5% per call with this). A plain read prefetch here did not help.
    if (any) {
      for (int64_t c = 0; c < channels; ++c) {
        const char* run = reinterpret_cast<const char*>(out + c * zyx);
        for (int64_t off = 0; off < cells * static_cast<int64_t>(sizeof(Out)); off += 64)
          OPBRIDGE_PREFETCH_WRITE(run + off);
      }
    }
    // NOTE: untrusted intervals were just checked to partition the points, so the tile's points
    // are one contiguous run: their ranks are checked in one vectorized pass before any is read through.
    // Points before `checked` have valid indices (the prefetch reads ahead up to there).
    const int64_t checked = j.trusted || !any ? j.points : int64_t{j.starts[k - 1]} + j.lengths[k - 1];
    if (!j.trusted && any && !points_ok(j, j.starts[i], checked)) return TaskResult::kBadRank;
    // NOTE: the next tile's indices (about as many points as this one) are requested now, so its
    // check above finds them in cache rather than waiting on them (~3% per call at BEVDet-R50 size).
    if (any) {
      const int64_t next_end = std::min(j.points, checked + (checked - j.starts[i]));
      for (int64_t p = checked; p < next_end; p += 64 / static_cast<int64_t>(sizeof(int32_t))) {
        OPBRIDGE_PREFETCH(j.rd + p);
        OPBRIDGE_PREFETCH(j.rf + p);
        OPBRIDGE_PREFETCH(j.rb + p);
      }
    }
    if (!any) {
      for (int64_t c = 0; c < channels; ++c) std::fill(out + c * zyx, out + c * zyx + cells, Num<Out>::store(A(0)));
    } else {
      for (int64_t c0 = 0; c0 < channels; c0 += chunk) {
        const int64_t n = std::min(chunk, channels - c0);
        // NOTE: only the rows no interval covers are zeroed, one fill per gap between covered rows
        // (zeroing every tile up front wrote 4 MB more per call at BEVDet-R50 size: ~4% of a call)
        int64_t row = 0;  // rows before it are summed or zeroed
        for (int64_t q = i; q < k; ++q) {
          const int64_t length = j.lengths[q];
          if (length == 0) continue;
          const int64_t start = j.starts[q], r = j.rb[start] - a;
          if (r > row) std::fill(tile + row * n, tile + r * n, A(0));
          pool_channels<false, W>(j.depth, j.feat, channels, j.rd + start, j.rf + start, length, checked - start, c0, n,
                                  tile + r * n);
          row = r + 1;
        }
        if (row < cells) std::fill(tile + row * n, tile + cells * n, A(0));
        write_tile<WT>(tile, n, n, cells, out + c0 * zyx, zyx, stage);
      }
    }
    i = k;
    a = b;
  }
  return TaskResult::kDone;
}

// The unsorted path after validation: per-cell sums in interval order (deterministic), serially.
template <int W, typename A, typename Out>
OPBRIDGE_INLINE void pool_unsorted(const Job<A, Out>& j, int64_t intervals, A* total) {
  const int64_t channels = j.channels;
  for (int64_t q = 0; q < intervals; ++q) {
    const int64_t length = j.lengths[q];
    if (length == 0) continue;
    const int64_t start = j.starts[q];
    pool_channels<true, W>(j.depth, j.feat, channels, j.rd + start, j.rf + start, length, j.points - start, 0,
                           channels, total + static_cast<int64_t>(j.rb[start]) * channels);
  }
}

// Cells [begin, end) of the per-cell accumulator into the output, a tile's geometry at a time.
template <int W, typename A, typename Out>
OPBRIDGE_INLINE void write_cells(const Job<A, Out>& j, const A* total, int64_t begin, int64_t end) {
  alignas(64) A stage[kScratchBytes / sizeof(A)];
  const int64_t chunk = chunk_of<A>(j.channels), tile_cells = tile_cells_of<A>(chunk);
  for (int64_t a = begin; a < end;) {
    const int64_t b = std::min({end, a + tile_cells, (a / j.zyx + 1) * j.zyx});
    Out* out = j.out + (a / j.zyx) * j.channels * j.zyx + a % j.zyx;
    for (int64_t c0 = 0; c0 < j.channels; c0 += chunk)
      write_tile<W>(total + a * j.channels + c0, j.channels, std::min(chunk, j.channels - c0), b - a,
                    out + c0 * j.zyx, j.zyx, stage);
    a = b;
  }
}

#if OPBRIDGE_X86_DISPATCH
template <typename A, typename Out>
OPBRIDGE_AVX2 TaskResult sorted_task_avx2(const Job<A, Out>& j, int64_t i0, int64_t i1, int64_t c0, int64_t c1) {
  return pool_sorted_task<32>(j, i0, i1, c0, c1);
}
template <typename A, typename Out>
OPBRIDGE_AVX2 void unsorted_avx2(const Job<A, Out>& j, int64_t intervals, A* total) {
  pool_unsorted<32>(j, intervals, total);
}
template <typename A, typename Out>
OPBRIDGE_AVX2 void cells_out_avx2(const Job<A, Out>& j, const A* total, int64_t begin, int64_t end) {
  write_cells<32>(j, total, begin, end);
}
#define OPBRIDGE_IF_AVX2(call) \
  if (isa_at_least(Isa::kAvx2)) return call
#else
#define OPBRIDGE_IF_AVX2(call)
#endif
#if OPBRIDGE_X86_AVX512
template <typename A, typename Out>
OPBRIDGE_AVX512 TaskResult sorted_task_avx512(const Job<A, Out>& j, int64_t i0, int64_t i1, int64_t c0, int64_t c1) {
  return pool_sorted_task<64, A, Out, 32>(j, i0, i1, c0, c1);
}
#define OPBRIDGE_IF_AVX512(call) \
  if (isa_at_least(Isa::kAvx512)) return call
#else
#define OPBRIDGE_IF_AVX512(call)
#endif

// The dispatch: once per task, not per element.
template <typename A, typename Out>
TaskResult sorted_task(const Job<A, Out>& j, int64_t i0, int64_t i1, int64_t c0, int64_t c1) {
  OPBRIDGE_IF_AVX512(sorted_task_avx512(j, i0, i1, c0, c1));
  OPBRIDGE_IF_AVX2(sorted_task_avx2(j, i0, i1, c0, c1));
  return pool_sorted_task<16>(j, i0, i1, c0, c1);
}
template <typename A, typename Out>
void unsorted(const Job<A, Out>& j, int64_t intervals, A* total) {
  OPBRIDGE_IF_AVX2(unsorted_avx2(j, intervals, total));
  pool_unsorted<16>(j, intervals, total);
}
template <typename A, typename Out>
void cells_out(const Job<A, Out>& j, const A* total, int64_t begin, int64_t end) {
  OPBRIDGE_IF_AVX2(cells_out_avx2(j, total, begin, end));
  write_cells<16>(j, total, begin, end);
}

// Are the intervals valid (inside the points, lengths >= 0, cells of non-empty ones in the grid),
// and are those cells strictly increasing? One serial scan (the fall-back path's).
struct IntervalScan {
  bool bad = false;
  bool sorted = true;
};

IntervalScan scan_intervals(const Indices& ix, int64_t n_cells) {
  IntervalScan s;
  const int64_t points = ix.ranks_depth.size;
  int64_t last = -1;
  for (int64_t i = 0; i < ix.interval_starts.size; ++i) {
    const int64_t start = ix.interval_starts[i], length = ix.interval_lengths[i];
    if (length < 0 || start < 0 || start + length > points) {
      s.bad = true;
      return s;
    }
    if (length == 0) continue;
    const int64_t cell = ix.ranks_bev[start];
    if (cell < 0 || cell >= n_cells) {
      s.bad = true;
      return s;
    }
    s.sorted = s.sorted && cell > last;
    last = cell;
  }
  return s;
}

// The machine's hardware threads (at least 1): how many loops claim tasks (the session's pool may
// run fewer at once; a loop that finds no task left returns at once).
int64_t hardware_threads() {
  static const int64_t n = std::max<unsigned>(1, std::thread::hardware_concurrency());
  return n;
}

// Splits [0, n) into `parts` near-equal blocks: block t is [split(n, parts, t), split(n, parts, t + 1)).
int64_t split(int64_t n, int64_t parts, int64_t t) { return n / parts * t + n % parts * t / parts; }

// Task t gets intervals [first[t], first[t + 1]) and owns cells [cell_from[t], cell_from[t + 1]):
// from its first non-empty interval's cell (task 0 from cell 0) up to the next task's. With
// by_points, tasks get near-equal point counts (interval starts are the running point count when
// the intervals partition the points), else near-equal interval counts. Every interval read here is
// checked first; false when the owned ranges would not be ordered (input that is not sorted).
bool plan_tasks(const Indices& ix, int64_t n_cells, int64_t tasks, bool by_points, int64_t* first, int64_t* cell_from) {
  const int64_t points = ix.ranks_depth.size, intervals = ix.interval_starts.size;
  first[0] = 0;
  first[tasks] = intervals;
  for (int64_t t = 1; t < tasks; ++t) {
    first[t] = by_points ? std::lower_bound(ix.interval_starts.begin(), ix.interval_starts.end(),
                                            split(points, tasks, t)) - ix.interval_starts.begin()
                         : split(intervals, tasks, t);
    first[t] = std::max(first[t], first[t - 1]);  // any input: the blocks stay ordered
  }
  cell_from[tasks] = n_cells;
  for (int64_t t = tasks - 1; t >= 0; --t) {
    cell_from[t] = cell_from[t + 1];
    for (int64_t q = first[t]; q < first[t + 1]; ++q) {
      const int64_t start = ix.interval_starts[q], length = ix.interval_lengths[q];
      if (length < 0 || start < 0 || start + length > points) return false;
      if (length == 0) continue;
      const int64_t cell = ix.ranks_bev[start];
      if (cell < 0 || cell >= n_cells) return false;
      cell_from[t] = cell;
      break;
    }
    if (cell_from[t] > cell_from[t + 1]) return false;
  }
  cell_from[0] = 0;
  return true;
}

// Requests the n values at p into L2 (a hint: no fault, no wait), one 64-byte line at a time.
template <typename A>
void request_lines(const A* p, int64_t n) {
  const char* bytes = reinterpret_cast<const char*>(p);
  const int64_t size = n * static_cast<int64_t>(sizeof(A));
  for (int64_t off = 0; off < size; off += 64) OPBRIDGE_PREFETCH_L2(bytes + off);
}

// validate() for input a pass found bad: its message names the first bad value.
Status first_error(const Indices& ix, int64_t depth_numel, int64_t feat_rows, int64_t n_cells) {
  Status st = validate(ix, depth_numel, feat_rows, n_cells);
  if (st.ok()) return Fail("internal error: an index failed a check in the pass but passed validation");
  return st;
}

template <typename T>
Status bev_pool_v2(Span<const T> depth, Span<const T> feat, const Indices& ix, const std::vector<int64_t>& bev_shape,
                   int64_t feat_rows, Span<T> out, Context& ctx) {
  using A = typename Num<T>::Acc;
  const int64_t channels = bev_shape[4];
  const int64_t zyx = bev_shape[1] * bev_shape[2] * bev_shape[3];
  const int64_t n_cells = bev_shape[0] * zyx;
  const int64_t points = ix.ranks_depth.size;
  const int64_t intervals = ix.interval_starts.size;
  OPBRIDGE_RETURN_IF_ERROR(validate_lengths(ix));
  // NOTE: an empty output needs no pass (and no scratch): only the checks.
  if (out.size == 0) return validate(ix, depth.size, feat_rows, n_cells);

  // float16: convert the inputs once to float32, the accumulator type.
  std::unique_ptr<float[]> depth32, feat32;
  const A* depth_a;
  const A* feat_a;
  if constexpr (std::is_same<T, uint16_t>::value) {
    depth32.reset(new (std::nothrow) float[static_cast<size_t>(std::max<int64_t>(depth.size, 1))]);
    feat32.reset(new (std::nothrow) float[static_cast<size_t>(std::max<int64_t>(feat.size, 1))]);
    if (!depth32 || !feat32) return Fail("cannot allocate float32 copies of 'depth' and 'feat' (float16 inputs)");
    for (int64_t q = 0; q < depth.size; ++q) depth32[q] = half_to_float(depth[q]);
    for (int64_t q = 0; q < feat.size; ++q) feat32[q] = half_to_float(feat[q]);
    depth_a = depth32.get();
    feat_a = feat32.get();
  } else {
    depth_a = depth.data;
    feat_a = feat.data;
  }
  Job<A, T> job{depth_a, feat_a, ix.ranks_depth.data, ix.ranks_feat.data, ix.ranks_bev.data,
                ix.interval_starts.data, ix.interval_lengths.data, channels, zyx, n_cells,
                u32_limit(depth.size), u32_limit(feat_rows), u32_limit(n_cells), points, intervals,
                /*trusted=*/false, out.data};

  constexpr int64_t kMaxTasks = 256;
  // NOTE: a parallel section waits for every worker that started; on busy cores a woken worker
  // may run only milliseconds later, so small inputs (< 64k points) stay on the calling thread.
  // Larger ones get small tasks (~4k points) that the threads claim one at a time from a shared
  // counter (from both ends, see run_tasks): the calling thread starts on a task at once, a worker
  // that wakes late (after 10 ms idle, its core halted) takes what is left, and the call waits for at
  // most one small task of a late worker. (With 8 fixed blocks of ~2 tasks a late worker could hold
  // the call for a whole block; a lone call measured 1.19 ms vs 0.72 ms back to back at BEVDet-R50 size.) Every
  // cell is summed by one task in interval order, so the result is the same whoever runs which task.
  // NOTE: measured in a standalone harness on a 2-vCPU VM (a blocking worker, as ORT's without
  // spinning): after 10 ms idle the worker usually starts 25-65 us into the call, at times not within
  // 1.3 ms (the host not running the halted vCPU); a lone call mostly pays cold caches (1 thread:
  // ~1.45 ms after 20 MB of other traffic and 10 ms idle, ~0.95 ms back to back).
  constexpr int64_t kParallelFrom = 64 * 1024, kPointsPerTask = 4 * 1024;
  const int64_t tasks = points < kParallelFrom ? 1
                                               : std::min<int64_t>({kMaxTasks, points / kPointsPerTask,
                                                                    std::max<int64_t>(intervals, 1)});
  int64_t first[kMaxTasks + 1], cell_from[kMaxTasks + 1];
  TaskResult results[kMaxTasks];
  // NOTE: the loop that starts first (the calling thread, as a rule; ORT may hand it any loop) first
  // requests all of depth and feat into L2, line after line, while the other loops start summing:
  // the gathers then mostly find their lines in cache instead of each waiting on memory. A call
  // after idle time finds its caches cold (on a shared VM even a 10 ms sleep leaves them so):
  // BEVDet-R50 size, 1 thread, after a 9 MB copy and 10 ms idle 1.16 -> 0.89 ms, after 64 MB of
  // other traffic 1.07 -> 0.97 ms; with caches warm it costs ~1%. Only when depth and feat hold at
  // most one 64-byte line per point: a call that gathers from a small part of large inputs does not
  // request them whole.
  const bool warm = (depth.size + feat.size) * static_cast<int64_t>(sizeof(A)) <= points * 64;
  auto run_tasks = [&]() {
    // NOTE: tasks are claimed from both ends of one counter (front claims in the low 32 bits, back
    // claims in the high ones; a claim is valid while front + back < tasks): even loops take tasks
    // 0, 1, 2, ..., odd loops tasks - 1, tasks - 2, ... Two threads then work on opposite halves of the
    // grid, seen mostly through different cameras of BEVDet's ring (presumably why it wins: each core's
    // cache holds fewer of the feat rows and depth values it gathers, where interleaved claims from one
    // end share them all). 2 threads at BEVDet-R50 size, standalone harness: ~0.61 -> ~0.51 ms (medians).
    // A cell is still summed by one task in interval order: the result does not depend on who runs what.
    std::atomic<uint64_t> claimed{0};
    std::atomic<bool> warmed{false};
    const int64_t loops = std::min<int64_t>(tasks, hardware_threads());
    ctx.parallel_for(loops, 1, [&](int64_t begin, int64_t end) {
      for (int64_t l = begin; l < end; ++l) {
        if (warm && !warmed.exchange(true, std::memory_order_relaxed)) {
          request_lines(depth_a, depth.size);
          request_lines(feat_a, feat.size);
        }
        const bool from_front = l % 2 == 0;
        for (;;) {
          const uint64_t c = claimed.fetch_add(from_front ? 1 : uint64_t{1} << 32, std::memory_order_relaxed);
          const int64_t front = static_cast<int64_t>(c & 0xffffffffu), back = static_cast<int64_t>(c >> 32);
          if (front + back >= tasks) break;
          const int64_t t = from_front ? front : tasks - 1 - back;
          results[t] = sorted_task(job, first[t], first[t + 1], cell_from[t], cell_from[t + 1]);
        }
      }
    });
    TaskResult worst = TaskResult::kDone;
    for (int64_t t = 0; t < tasks; ++t)
      if (results[t] != TaskResult::kDone && worst != TaskResult::kBadRank) worst = results[t];
    return worst;
  };

  // 1. What voxel_pooling_prepare_v2 gives (cells of the non-empty intervals strictly increasing,
  // intervals partitioning the points): one parallel pass, each task checking its own intervals
  // and ranks before reading through them.
  // NOTE: one parallel section, not a separate checking pass: each section waits for every
  // worker that started, and a worker preempted on busy cores stalls the whole call.
  if (plan_tasks(ix, n_cells, tasks, /*by_points=*/true, first, cell_from)) {
    const TaskResult r = run_tasks();
    if (r == TaskResult::kDone) return Status::OK();
    if (r == TaskResult::kBadRank) return first_error(ix, depth.size, feat_rows, n_cells);
  }

  // 2. Anything else: validate everything up front, serially, then pass without checks.
  const IntervalScan scan = scan_intervals(ix, n_cells);
  if (scan.bad) return first_error(ix, depth.size, feat_rows, n_cells);
  OPBRIDGE_RETURN_IF_ERROR(validate(ix, depth.size, feat_rows, n_cells));
  job.trusted = true;
  if (scan.sorted) {  // sorted, but not a partition (gaps, points no interval covers)
    if (!plan_tasks(ix, n_cells, tasks, /*by_points=*/false, first, cell_from))
      return Fail("internal error: sorted intervals gave unordered tasks");
    run_tasks();
    return Status::OK();
  }

  // 3. Several intervals on one cell, or cells out of order: sum serially per cell.
  const int64_t total_size = n_cells * channels;  // = out.size, no overflow
  std::unique_ptr<A[]> total(new (std::nothrow) A[static_cast<size_t>(total_size)]);
  if (!total) return Fail("cannot allocate the ", total_size, "-element accumulator (several intervals per cell)");
  std::fill(total.get(), total.get() + total_size, A(0));
  unsorted(job, intervals, total.get());
  ctx.parallel_for(n_cells, 256, [&](int64_t begin, int64_t end) { cells_out(job, total.get(), begin, end); });
  return Status::OK();
}

// a * b into *out, false on int64 overflow (both >= 0).
bool mul_ok(int64_t a, int64_t b, int64_t* out) { return !__builtin_mul_overflow(a, b, out); }

struct BevPoolV2 {
  std::vector<int64_t> bev_feat_shape;  // [B, Z, Y, X, C]
  std::vector<int64_t> out_shape;       // [B, C, Z, Y, X], made once here: a call allocates nothing for it

  static Status Read(const Attributes& attrs, BevPoolV2* self) {
    OPBRIDGE_RETURN_IF_ERROR(attrs.get("bev_feat_shape", &self->bev_feat_shape));
    const auto& s = self->bev_feat_shape;
    if (s.size() != 5 || *std::min_element(s.begin(), s.end()) < 0)
      return Fail("attribute 'bev_feat_shape' must be 5 sizes [B, Z, Y, X, C] >= 0, got ", shape_str(s));
    // NOTE: every partial product of the sizes (cells, channel planes, elements, bytes) must fit in
    // int64: bound the product of the sizes with zeros counted as 1.
    int64_t n = 1;
    for (int64_t d : s)
      if (!mul_ok(n, std::max<int64_t>(d, 1), &n) || n > std::numeric_limits<int64_t>::max() / 8)
        return Fail("attribute 'bev_feat_shape' ", shape_str(s), " describes more elements than memory can hold");
    self->out_shape = {s[0], s[4], s[1], s[2], s[3]};
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
    switch (feat.dtype) {
      case DType::kFloat: return run<float>(ctx, depth, feat, ix, feat_rows);
      case DType::kDouble: return run<double>(ctx, depth, feat, ix, feat_rows);
      case DType::kFloat16: return run<uint16_t>(ctx, depth, feat, ix, feat_rows);
      default: return Fail("inputs 'depth'/'feat' have unsupported dtype ", dtype_name(feat.dtype));
    }
  }

  template <typename T>
  Status run(Context& ctx, const TensorView& depth, const TensorView& feat, const Indices& ix, int64_t feat_rows) const {
    Span<T> out;
    OPBRIDGE_RETURN_IF_ERROR(ctx.output(0, out_shape, &out));
    // NOTE: no C++ exception may cross into ONNX Runtime; the pass allocates with nothrow, so only
    // the error-message formatting could throw.
    try {
      return bev_pool_v2<T>(depth.span<T>(), feat.span<T>(), ix, bev_feat_shape, feat_rows, out, ctx);
    } catch (...) {
      return Status::Error("bev_pool_v2 failed: out of memory while reporting an error");
    }
  }
};

}  // namespace

extern const KernelDef kernel_bev_op_bev_pool_v2 = make_kernel<BevPoolV2>();

}  // namespace opbridge
