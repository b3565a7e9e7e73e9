// Greedy non-maximum suppression as detection libraries' CPU kernels write it, for two ops:
// detectlike::nms (tests/test_data_dependent.py) and torchvision::nms (torchvision's schema: no score
// threshold). Boxes [N, 4] (x1, y1, x2, y2) whose score is > score_threshold (detectlike) are visited by
// descending score (ties: lower index first); each kept box suppresses the later ones whose IoU with it
// is > iou_threshold. The output is the kept indices (int64, in visiting order): its length depends on
// the values, so the kernel computes the count first and only then allocates the output.
#include <algorithm>
#include <numeric>
#include <vector>

#include "opbridge_kernel.h"

namespace opbridge {
namespace {

template <typename T>
std::vector<int64_t> greedy_nms(const T* boxes, const T* scores, int64_t n, double iou_threshold,
                                const float* score_threshold) {
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    if (score_threshold == nullptr || scores[i] > *score_threshold) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return scores[a] > scores[b]; });
  std::vector<T> areas(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const T* b = boxes + 4 * i;
    areas[static_cast<size_t>(i)] = (b[2] - b[0]) * (b[3] - b[1]);
  }
  std::vector<char> suppressed(static_cast<size_t>(n), 0);
  std::vector<int64_t> keep;
  for (size_t a = 0; a < order.size(); ++a) {
    const int64_t i = order[a];
    if (suppressed[static_cast<size_t>(i)]) continue;
    keep.push_back(i);
    const T* bi = boxes + 4 * i;
    for (size_t c = a + 1; c < order.size(); ++c) {
      const int64_t j = order[c];
      if (suppressed[static_cast<size_t>(j)]) continue;
      const T* bj = boxes + 4 * j;
      const T w = std::max<T>(std::min(bi[2], bj[2]) - std::max(bi[0], bj[0]), T(0));
      const T h = std::max<T>(std::min(bi[3], bj[3]) - std::max(bi[1], bj[1]), T(0));
      const T inter = w * h;
      // NOTE: computed as the eager kernel does (inter / union in the input dtype, then > the
      // threshold): a zero-area pair gives NaN there, which suppresses nothing here too.
      const T iou = inter / (areas[static_cast<size_t>(i)] + areas[static_cast<size_t>(j)] - inter);
      if (iou > iou_threshold) suppressed[static_cast<size_t>(j)] = 1;
    }
  }
  return keep;
}

// kScoreThreshold: the op has a score_threshold attribute (detectlike::nms), else every box is a candidate.
template <bool kScoreThreshold>
struct Nms {
  float iou_threshold = 0.f;
  float score_threshold = 0.f;

  static Status Read(const Attributes& attrs, Nms* self) {
    OPBRIDGE_RETURN_IF_ERROR(attrs.get("iou_threshold", &self->iou_threshold));
    return kScoreThreshold ? attrs.get("score_threshold", &self->score_threshold) : Status::OK();
  }

  Status Compute(Context& ctx) const {
    const TensorView& boxes = ctx.input(0);
    const TensorView& scores = ctx.input(1);
    OPBRIDGE_RETURN_IF_ERROR(expect_rank(boxes, "boxes", 2));
    OPBRIDGE_RETURN_IF_ERROR(expect_rank(scores, "scores", 1));
    if (boxes.shape[1] != 4) return Fail("input 'boxes' must be [N, 4], got ", shape_str(boxes.shape));
    if (scores.shape[0] != boxes.shape[0])
      return Fail("input 'scores' must hold one score per box (", boxes.shape[0], "), got ", shape_str(scores.shape));
    if (scores.dtype != boxes.dtype)
      return Fail("input 'scores' must have the dtype of 'boxes' (", dtype_name(boxes.dtype), "), got ",
                  dtype_name(scores.dtype));
    const int64_t n = boxes.shape[0];
    const float* threshold = kScoreThreshold ? &score_threshold : nullptr;
    std::vector<int64_t> keep;
    if (boxes.dtype == DType::kFloat) {
      keep = greedy_nms(boxes.span<float>().data, scores.span<float>().data, n, iou_threshold, threshold);
    } else if (boxes.dtype == DType::kDouble) {
      keep = greedy_nms(boxes.span<double>().data, scores.span<double>().data, n, iou_threshold, threshold);
    } else {
      return Fail("input 'boxes' must be float32 or float64, got ", dtype_name(boxes.dtype));
    }
    Span<int64_t> out;  // the count is known only now: the output is allocated after the suppression
    OPBRIDGE_RETURN_IF_ERROR(ctx.output(0, {static_cast<int64_t>(keep.size())}, &out));
    std::copy(keep.begin(), keep.end(), out.begin());
    return Status::OK();
  }
};

}  // namespace

extern const KernelDef kernel_detectlike_op_nms = make_kernel<Nms<true>>();
extern const KernelDef kernel_torchvision_op_nms = make_kernel<Nms<false>>();

}  // namespace opbridge
