// opbridge::crop — PIL-style crop of (..., H, W) to box [left, top, right, bottom]; pixels outside
// the image are zero. Pure data movement, so one byte-level kernel serves every dtype.
#include <algorithm>
#include <cstring>
#include <vector>

#include "opbridge_kernel.h"

namespace opbridge {
namespace {

void crop(const char* img, int64_t planes, int64_t h, int64_t w, int64_t elem, const std::vector<int64_t>& box,
          char* out) {
  const int64_t left = box[0], top = box[1], out_h = box[3] - box[1], out_w = box[2] - box[0];
  const int64_t x0 = std::max<int64_t>(left, 0), x1 = std::min<int64_t>(box[2], w);
  std::memset(out, 0, static_cast<size_t>(planes * out_h * out_w * elem));
  if (x0 >= x1) return;
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t r = 0; r < out_h; ++r) {
      const int64_t y = top + r;
      if (y < 0 || y >= h) continue;
      std::memcpy(out + ((p * out_h + r) * out_w + (x0 - left)) * elem, img + ((p * h + y) * w + x0) * elem,
                  static_cast<size_t>((x1 - x0) * elem));
    }
  }
}

struct Crop {
  std::vector<int64_t> box;

  static Status Read(const Attributes& attrs, Crop* self) {
    OPBRIDGE_RETURN_IF_ERROR(attrs.get("box", &self->box));
    const auto& b = self->box;
    if (b.size() != 4 || b[2] < b[0] || b[3] < b[1])
      return Fail("attribute 'box' must be [left, top, right, bottom] with right >= left and bottom >= top, got ",
                  shape_str(b));
    return Status::OK();
  }

  Status Compute(Context& ctx) const {
    const TensorView& img = ctx.input(0);
    OPBRIDGE_RETURN_IF_ERROR(expect_min_rank(img, "img", 2));
    const size_t r = img.shape.size();
    std::vector<int64_t> out_shape(img.shape.begin(), img.shape.end() - 2);
    out_shape.push_back(box[3] - box[1]);
    out_shape.push_back(box[2] - box[0]);
    void* out = nullptr;
    OPBRIDGE_RETURN_IF_ERROR(ctx.output(0, out_shape, &out));
    const int64_t h = img.shape[r - 2], w = img.shape[r - 1];
    int64_t planes = 1;
    for (size_t i = 0; i + 2 < r; ++i) planes *= img.shape[i];
    crop(static_cast<const char*>(img.data), planes, h, w, static_cast<int64_t>(dtype_size(img.dtype)), box,
         static_cast<char*>(out));
    return Status::OK();
  }
};

}  // namespace

extern const KernelDef kernel_opbridge_op_crop = make_kernel<Crop>();

}  // namespace opbridge
