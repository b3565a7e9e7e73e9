// RoIAlign as torchvision's CPU kernel computes it (mmcv's, in mode "avg", is the same algorithm), for two
// nodes: torchvision::roi_align (attributes pooled_height, pooled_width, spatial_scale, sampling_ratio,
// aligned) and mmcv::MMCVRoiAlign (what mmcv's RoIAlignFunction.symbolic writes: output_height,
// output_width, spatial_scale, sampling_ratio, mode, aligned; tests/test_functions.py).
// input [B, C, H, W], rois [K, 5] (batch index, x1, y1, x2, y2) -> [K, C, pooled_height, pooled_width]: each
// bin is the average of bilinear samples on a grid (sampling_ratio per side, or ceil(roi size / pooled size)
// when it is <= 0); `aligned` shifts the box by half a pixel and lets it be smaller than one pixel.
#include <algorithm>
#include <cmath>
#include <string>

#include "opbridge_kernel.h"

namespace opbridge {
namespace {

template <typename T>
T bilinear(const T* plane, int64_t height, int64_t width, T y, T x) {
  // NOTE: written as a negated range test so that NaN coordinates read nothing (return 0 too)
  if (!(y >= T(-1) && y <= T(height) && x >= T(-1) && x <= T(width))) return T(0);
  y = std::max(y, T(0));
  x = std::max(x, T(0));
  int64_t y_low = static_cast<int64_t>(y), x_low = static_cast<int64_t>(x), y_high, x_high;
  if (y_low >= height - 1) {
    y_high = y_low = height - 1;
    y = T(y_low);
  } else {
    y_high = y_low + 1;
  }
  if (x_low >= width - 1) {
    x_high = x_low = width - 1;
    x = T(x_low);
  } else {
    x_high = x_low + 1;
  }
  const T ly = y - T(y_low), lx = x - T(x_low), hy = T(1) - ly, hx = T(1) - lx;
  return hy * hx * plane[y_low * width + x_low] + hy * lx * plane[y_low * width + x_high] +
         ly * hx * plane[y_high * width + x_low] + ly * lx * plane[y_high * width + x_high];
}

struct RoiAlign {
  float spatial_scale = 1.f;
  int64_t pooled_height = 0, pooled_width = 0, sampling_ratio = 0, aligned = 0;

  static Status Read(const Attributes& attrs, RoiAlign* self) {
    return self->ReadNamed(attrs, "pooled_height", "pooled_width");
  }

  Status ReadNamed(const Attributes& attrs, const char* height_name, const char* width_name) {
    OPBRIDGE_RETURN_IF_ERROR(attrs.get("spatial_scale", &spatial_scale));
    OPBRIDGE_RETURN_IF_ERROR(attrs.get(height_name, &pooled_height));
    OPBRIDGE_RETURN_IF_ERROR(attrs.get(width_name, &pooled_width));
    OPBRIDGE_RETURN_IF_ERROR(attrs.get("sampling_ratio", &sampling_ratio));
    OPBRIDGE_RETURN_IF_ERROR(attrs.get("aligned", &aligned));
    if (pooled_height <= 0 || pooled_width <= 0)
      return Fail("attributes '", height_name, "' and '", width_name, "' must be > 0, got ", pooled_height, " and ",
                  pooled_width);
    return Status::OK();
  }

  template <typename T>
  Status Run(Context& ctx, const TensorView& input, const TensorView& rois) const {
    const int64_t batch = input.shape[0], channels = input.shape[1], height = input.shape[2],
                  width = input.shape[3], count = rois.shape[0];
    const T* r = rois.span<T>().data;
    for (int64_t k = 0; k < count; ++k) {  // every batch index is checked before any output is written
      const T b = r[5 * k];
      if (!(b >= T(0) && b < T(batch)) || b != std::floor(b))
        return Fail("input 'rois' has batch index ", b, " in row ", k, ", outside [0, ", batch, ")");
      for (int j = 1; j < 5; ++j)  // NOTE: a NaN or infinite box would size the sampling grid from garbage
        if (!std::isfinite(r[5 * k + j])) return Fail("input 'rois' has coordinate ", r[5 * k + j], " in row ", k);
    }
    Span<T> out;
    OPBRIDGE_RETURN_IF_ERROR(ctx.output(0, {count, channels, pooled_height, pooled_width}, &out));
    const T* in = input.span<T>().data;
    const T offset = aligned ? T(0.5) : T(0), scale = T(spatial_scale);
    ctx.parallel_for(count * channels, 1, [&](int64_t begin, int64_t end) {
      for (int64_t kc = begin; kc < end; ++kc) {
        const int64_t k = kc / channels, c = kc % channels;
        const T* roi = r + 5 * k;
        const T* plane = in + (static_cast<int64_t>(roi[0]) * channels + c) * height * width;
        const T x1 = roi[1] * scale - offset, y1 = roi[2] * scale - offset;
        T roi_w = roi[3] * scale - offset - x1, roi_h = roi[4] * scale - offset - y1;
        if (!aligned) {
          roi_w = std::max(roi_w, T(1));
          roi_h = std::max(roi_h, T(1));
        }
        const T bin_h = roi_h / T(pooled_height), bin_w = roi_w / T(pooled_width);
        const int64_t grid_h = sampling_ratio > 0 ? sampling_ratio : static_cast<int64_t>(std::ceil(roi_h / T(pooled_height)));
        const int64_t grid_w = sampling_ratio > 0 ? sampling_ratio : static_cast<int64_t>(std::ceil(roi_w / T(pooled_width)));
        const T samples = T(std::max<int64_t>(grid_h * grid_w, 1));
        T* o = out.data + kc * pooled_height * pooled_width;
        for (int64_t ph = 0; ph < pooled_height; ++ph) {
          for (int64_t pw = 0; pw < pooled_width; ++pw) {
            T sum = T(0);
            for (int64_t iy = 0; iy < grid_h; ++iy) {
              const T y = y1 + T(ph) * bin_h + (T(iy) + T(0.5)) * bin_h / T(grid_h);
              for (int64_t ix = 0; ix < grid_w; ++ix) {
                const T x = x1 + T(pw) * bin_w + (T(ix) + T(0.5)) * bin_w / T(grid_w);
                sum += bilinear(plane, height, width, y, x);
              }
            }
            o[ph * pooled_width + pw] = sum / samples;
          }
        }
      }
    });
    return Status::OK();
  }

  Status Compute(Context& ctx) const {
    const TensorView& input = ctx.input(0);
    const TensorView& rois = ctx.input(1);
    OPBRIDGE_RETURN_IF_ERROR(expect_rank(input, "input", 4));
    OPBRIDGE_RETURN_IF_ERROR(expect_rank(rois, "rois", 2));
    if (rois.shape[1] != 5) return Fail("input 'rois' must be [K, 5], got ", shape_str(rois.shape));
    if (rois.dtype != input.dtype)
      return Fail("input 'rois' must have the dtype of 'input' (", dtype_name(input.dtype), "), got ",
                  dtype_name(rois.dtype));
    if (input.dtype == DType::kFloat) return Run<float>(ctx, input, rois);
    if (input.dtype == DType::kDouble) return Run<double>(ctx, input, rois);
    return Fail("input 'input' must be float32 or float64, got ", dtype_name(input.dtype));
  }
};

struct MmcvRoiAlign : RoiAlign {
  static Status Read(const Attributes& attrs, MmcvRoiAlign* self) {
    std::string mode;
    OPBRIDGE_RETURN_IF_ERROR(attrs.get("mode", &mode));
    if (mode != "avg") return Fail("attribute 'mode' must be \"avg\" (this kernel averages), got \"", mode, "\"");
    return self->ReadNamed(attrs, "output_height", "output_width");
  }
};

}  // namespace

extern const KernelDef kernel_torchvision_op_roi_align = make_kernel<RoiAlign>();
extern const KernelDef kernel_mmcv_op_MMCVRoiAlign = make_kernel<MmcvRoiAlign>();

}  // namespace opbridge
