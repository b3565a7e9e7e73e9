// opbridge::paste — PIL-style paste of patch (..., h, w) into a copy of image (..., H, W) at
// (left, top), clipped to the image. Byte-level, so one kernel serves every dtype.
#include <algorithm>
#include <cstring>
#include <vector>

#include "opbridge_kernel.h"

namespace opbridge {
namespace {

void paste(const char* image, const char* patch, int64_t planes, int64_t h, int64_t w, int64_t ph, int64_t pw,
           int64_t elem, int64_t left, int64_t top, char* out) {
  std::memcpy(out, image, static_cast<size_t>(planes * h * w * elem));
  const int64_t x0 = std::max<int64_t>(left, 0), x1 = std::min<int64_t>(left + pw, w);
  if (x0 >= x1) return;
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t r = 0; r < ph; ++r) {
      const int64_t y = top + r;
      if (y < 0 || y >= h) continue;
      std::memcpy(out + ((p * h + y) * w + x0) * elem, patch + ((p * ph + r) * pw + (x0 - left)) * elem,
                  static_cast<size_t>((x1 - x0) * elem));
    }
  }
}

struct Paste {
  int64_t left = 0, top = 0;

  static Status Read(const Attributes& attrs, Paste* self) {
    OPBRIDGE_RETURN_IF_ERROR(attrs.get("left", &self->left));
    return attrs.get("top", &self->top);
  }

  Status Compute(Context& ctx) const {
    const TensorView& image = ctx.input(0);
    const TensorView& patch = ctx.input(1);
    OPBRIDGE_RETURN_IF_ERROR(expect_min_rank(image, "image", 2));
    const size_t r = image.shape.size();
    if (patch.shape.size() != r || !std::equal(image.shape.begin(), image.shape.end() - 2, patch.shape.begin()))
      return Fail("inputs 'image' ", shape_str(image.shape), " and 'patch' ", shape_str(patch.shape),
                  " must share their leading dims");
    if (patch.dtype != image.dtype)
      return Fail("input 'patch' is ", dtype_name(patch.dtype), ", 'image' is ", dtype_name(image.dtype));
    void* out = nullptr;
    OPBRIDGE_RETURN_IF_ERROR(ctx.output(0, image.shape, &out));
    int64_t planes = 1;
    for (size_t i = 0; i + 2 < r; ++i) planes *= image.shape[i];
    paste(static_cast<const char*>(image.data), static_cast<const char*>(patch.data), planes, image.shape[r - 2],
          image.shape[r - 1], patch.shape[r - 2], patch.shape[r - 1], static_cast<int64_t>(dtype_size(image.dtype)),
          left, top, static_cast<char*>(out));
    return Status::OK();
  }
};

}  // namespace

extern const KernelDef kernel_opbridge_op_paste = make_kernel<Paste>();

}  // namespace opbridge
