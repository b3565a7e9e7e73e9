// bench::bev_pool_v2_floor — the memory floor of bev::bev_pool_v2 (benchmarks/floor_op.py): reads every
// byte of every input once and writes every byte of the output once, nothing else, on the same
// threads the kernel uses (the session's intra-op pool through the same parallel_for, the same
// number of loops claiming tasks from one counter, the same serial rule below 64k points). Timed
// through the same onnxruntime session path as the kernel, so both pay the same call overhead.
// Output 0: zeros of the kernel's output shape. Output 1: the sum (mod 2^64) of every input's bytes
// read as little-endian uint64 words (a tail of fewer than 8 bytes: byte by byte), so a test can
// check that each input byte was read once (a chunk read twice or skipped changes the sum).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "opbridge_kernel.h"

namespace opbridge {
namespace {

constexpr int64_t kChunk = 64 * 1024;  // bytes per task: a multiple of 8 (word reads stay aligned to each input)
// NOTE: as bev_op_bev_pool_v2.cc: below 64k points the kernel stays on the calling thread
constexpr int64_t kParallelFrom = 64 * 1024;
constexpr int64_t kMaxTasks = 1 << 16;

int64_t hardware_threads() {
  static const int64_t n = std::max<unsigned>(1, std::thread::hardware_concurrency());
  return n;
}

struct Task {
  const unsigned char* read = nullptr;  // a chunk of an input, or nullptr
  unsigned char* write = nullptr;       // a chunk of the output, or nullptr
  int64_t bytes = 0;
};

uint64_t sum_bytes(const unsigned char* p, int64_t n) {
  // NOTE: 4 independent sums (vectorized by -O3); memcpy reads the words whatever the alignment
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  const int64_t words = n / 8;
  int64_t w = 0;
  for (; w + 4 <= words; w += 4) {
    uint64_t v[4];
    std::memcpy(v, p + w * 8, sizeof v);
    s0 += v[0];
    s1 += v[1];
    s2 += v[2];
    s3 += v[3];
  }
  for (; w < words; ++w) {
    uint64_t v;
    std::memcpy(&v, p + w * 8, 8);
    s0 += v;
  }
  for (int64_t b = words * 8; b < n; ++b) s1 += p[b];
  return s0 + s1 + s2 + s3;
}

struct Floor {
  std::vector<int64_t> out_shape;  // [B, C, Z, Y, X]

  static Status Read(const Attributes& attrs, Floor* self) {
    std::vector<int64_t> s;
    OPBRIDGE_RETURN_IF_ERROR(attrs.get("bev_feat_shape", &s));
    if (s.size() != 5) return Fail("attribute 'bev_feat_shape' must be 5 sizes, got ", shape_str(s));
    self->out_shape = {s[0], s[4], s[1], s[2], s[3]};
    return Status::OK();
  }

  Status Compute(Context& ctx) const {
    if (ctx.input(1).dtype != DType::kFloat) return Fail("input 'feat' must be float32");
    Span<float> out;
    OPBRIDGE_RETURN_IF_ERROR(ctx.output(0, out_shape, &out));
    Span<int64_t> checksum;
    OPBRIDGE_RETURN_IF_ERROR(ctx.output(1, {1}, &checksum));
    std::vector<Task> tasks;
    auto add = [&](const unsigned char* read, unsigned char* write, int64_t bytes) {
      for (int64_t off = 0; off < bytes; off += kChunk)
        tasks.push_back({read ? read + off : nullptr, write ? write + off : nullptr, std::min(kChunk, bytes - off)});
    };
    for (int i = 0; i < ctx.num_inputs(); ++i) {
      const TensorView& t = ctx.input(i);
      const int64_t size = t.dtype == DType::kFloat || t.dtype == DType::kInt32 ? 4 : 8;
      add(static_cast<const unsigned char*>(t.data), nullptr, t.numel() * size);
    }
    add(nullptr, reinterpret_cast<unsigned char*>(out.data), out.size * static_cast<int64_t>(sizeof(float)));
    if (static_cast<int64_t>(tasks.size()) > kMaxTasks) return Fail("inputs too large for the floor");
    const int64_t points = ctx.input(2).numel();
    const int64_t n = static_cast<int64_t>(tasks.size());
    const int64_t loops = points < kParallelFrom ? 1 : std::min<int64_t>(n, hardware_threads());
    std::atomic<int64_t> claimed{0};
    std::atomic<uint64_t> total{0};
    auto run = [&](int64_t, int64_t) {
      uint64_t sum = 0;
      for (int64_t t; (t = claimed.fetch_add(1, std::memory_order_relaxed)) < n;) {
        const Task& task = tasks[t];
        if (task.read) sum += sum_bytes(task.read, task.bytes);
        if (task.write) std::memset(task.write, 0, static_cast<size_t>(task.bytes));
      }
      total.fetch_add(sum, std::memory_order_relaxed);
    };
    if (loops == 1)
      run(0, 1);
    else
      ctx.parallel_for(loops, 1, [&](int64_t begin, int64_t end) {
        for (int64_t l = begin; l < end; ++l) run(l, l + 1);
      });
    checksum[0] = static_cast<int64_t>(total.load());
    return Status::OK();
  }
};

}  // namespace

extern const KernelDef kernel_bench_op_bev_pool_v2_floor = make_kernel<Floor>();

}  // namespace opbridge
