// A wrong kernel for detectlike::nms, on purpose: it visits the boxes in index order (the sort by
// score forgotten). tests/test_data_dependent.py registers it in a registry of its own to show that
// the native tier's parity runs the C++ kernel (this one fails it) and not the op's function body.
#include <algorithm>
#include <vector>

#include "opbridge_kernel.h"

namespace opbridge {
namespace {

struct UnsortedNms {
  float iou_threshold = 0.f;
  float score_threshold = 0.f;

  static Status Read(const Attributes& attrs, UnsortedNms* self) {
    OPBRIDGE_RETURN_IF_ERROR(attrs.get("iou_threshold", &self->iou_threshold));
    return attrs.get("score_threshold", &self->score_threshold);
  }

  Status Compute(Context& ctx) const {
    const TensorView& boxes = ctx.input(0);
    if (boxes.dtype != DType::kFloat) return Fail("input 'boxes' must be float32");
    const float* b = boxes.span<float>().data;
    const float* s = ctx.input(1).span<float>().data;
    const int64_t n = boxes.shape[0];
    std::vector<int64_t> keep;
    for (int64_t i = 0; i < n; ++i) {
      if (s[i] <= score_threshold) continue;
      bool suppressed = false;
      for (int64_t k : keep) {
        const float* p = b + 4 * k;
        const float* q = b + 4 * i;
        const float w = std::max(std::min(p[2], q[2]) - std::max(p[0], q[0]), 0.f);
        const float h = std::max(std::min(p[3], q[3]) - std::max(p[1], q[1]), 0.f);
        const float inter = w * h;
        suppressed = suppressed || inter / ((p[2] - p[0]) * (p[3] - p[1]) + (q[2] - q[0]) * (q[3] - q[1]) - inter) >
                                       iou_threshold;
      }
      if (!suppressed) keep.push_back(i);
    }
    Span<int64_t> out;
    OPBRIDGE_RETURN_IF_ERROR(ctx.output(0, {static_cast<int64_t>(keep.size())}, &out));
    for (int64_t i = 0; i < out.size; ++i) out[i] = keep[static_cast<size_t>(i)];
    return Status::OK();
  }
};

}  // namespace

extern const KernelDef kernel_detectlike_op_nms = make_kernel<UnsortedNms>();

}  // namespace opbridge
