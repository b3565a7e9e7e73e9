// torchvision::deform_conv2d: deformable convolution v2 as torchvision's CPU kernel computes it. input
// [N, C, H, W], weight [O, C / groups, kh, kw], offset [N, offset_groups * 2 * kh * kw, oh, ow] ((dy, dx)
// per kernel tap), mask [N, offset_groups * kh * kw, oh, ow] (read when use_mask), bias [O]: each tap
// samples the input bilinearly at its offset position (zero outside), times the mask, then a grouped
// convolution over the samples (im2col, then one dot product per output).
#include <cmath>
#include <utility>
#include <vector>

#include "opbridge_kernel.h"

namespace opbridge {
namespace {

template <typename T>
T bilinear(const T* plane, int64_t height, int64_t width, T y, T x) {
  if (y <= T(-1) || y >= T(height) || x <= T(-1) || x >= T(width)) return T(0);
  const int64_t y_low = static_cast<int64_t>(std::floor(y)), x_low = static_cast<int64_t>(std::floor(x));
  const int64_t y_high = y_low + 1, x_high = x_low + 1;
  const T ly = y - T(y_low), lx = x - T(x_low), hy = T(1) - ly, hx = T(1) - lx;
  const bool top = y_low >= 0, bottom = y_high <= height - 1, left = x_low >= 0, right = x_high <= width - 1;
  const T v1 = top && left ? plane[y_low * width + x_low] : T(0);
  const T v2 = top && right ? plane[y_low * width + x_high] : T(0);
  const T v3 = bottom && left ? plane[y_high * width + x_low] : T(0);
  const T v4 = bottom && right ? plane[y_high * width + x_high] : T(0);
  return hy * hx * v1 + hy * lx * v2 + ly * hx * v3 + ly * lx * v4;
}

int64_t out_size(int64_t size, int64_t pad, int64_t dilation, int64_t kernel, int64_t stride) {
  return (size + 2 * pad - (dilation * (kernel - 1) + 1)) / stride + 1;
}

struct DeformConv2d {
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1, groups = 1,
          offset_groups = 1, use_mask = 0;

  static Status Read(const Attributes& attrs, DeformConv2d* s) {
    for (auto [name, field] : {std::pair<const char*, int64_t*>{"stride_h", &s->stride_h}, {"stride_w", &s->stride_w},
                               {"pad_h", &s->pad_h}, {"pad_w", &s->pad_w}, {"dilation_h", &s->dilation_h},
                               {"dilation_w", &s->dilation_w}, {"groups", &s->groups},
                               {"offset_groups", &s->offset_groups}, {"use_mask", &s->use_mask}})
      OPBRIDGE_RETURN_IF_ERROR(attrs.get(name, field));
    if (s->stride_h <= 0 || s->stride_w <= 0 || s->dilation_h <= 0 || s->dilation_w <= 0 || s->groups <= 0 ||
        s->offset_groups <= 0 || s->pad_h < 0 || s->pad_w < 0)
      return Fail("attributes stride, dilation, groups and offset_groups must be > 0 and pads >= 0, got stride ",
                  s->stride_h, "x", s->stride_w, ", dilation ", s->dilation_h, "x", s->dilation_w, ", groups ",
                  s->groups, ", offset_groups ", s->offset_groups, ", pad ", s->pad_h, "x", s->pad_w);
    return Status::OK();
  }

  template <typename T>
  Status Run(Context& ctx, int64_t oh, int64_t ow) const {
    const TensorView &input = ctx.input(0), &weight = ctx.input(1), &offset = ctx.input(2), &mask = ctx.input(3),
                     &bias = ctx.input(4);
    const int64_t n = input.shape[0], c = input.shape[1], height = input.shape[2], width = input.shape[3];
    const int64_t out_c = weight.shape[0], kh = weight.shape[2], kw = weight.shape[3], taps = kh * kw;
    const int64_t cg = c / offset_groups, cpg = c / groups, opg = out_c / groups, plane = oh * ow;
    Span<T> out;
    OPBRIDGE_RETURN_IF_ERROR(ctx.output(0, {n, out_c, oh, ow}, &out));
    const T *in = input.span<T>().data, *w = weight.span<T>().data, *off = offset.span<T>().data,
            *m = use_mask ? mask.span<T>().data : nullptr, *b = bias.span<T>().data;
    ctx.parallel_for(n, 1, [&](int64_t begin, int64_t end) {
      std::vector<T> columns(static_cast<size_t>(c * taps * plane));  // [C, taps, oh * ow]
      for (int64_t i = begin; i < end; ++i) {
        for (int64_t ch = 0; ch < c; ++ch) {
          const int64_t g = ch / cg;
          const T* img = in + (i * c + ch) * height * width;
          for (int64_t t = 0; t < taps; ++t) {
            const T* dy = off + ((i * offset_groups + g) * 2 * taps + 2 * t) * plane;
            const T* dx = dy + plane;
            const T* mk = m == nullptr ? nullptr : m + ((i * offset_groups + g) * taps + t) * plane;
            T* col = columns.data() + (ch * taps + t) * plane;
            for (int64_t y = 0; y < oh; ++y) {
              for (int64_t x = 0; x < ow; ++x) {
                const int64_t p = y * ow + x;
                const T sy = T(y * stride_h - pad_h + (t / kw) * dilation_h) + dy[p];
                const T sx = T(x * stride_w - pad_w + (t % kw) * dilation_w) + dx[p];
                const T v = bilinear(img, height, width, sy, sx);
                col[p] = mk == nullptr ? v : v * mk[p];
              }
            }
          }
        }
        for (int64_t o = 0; o < out_c; ++o) {
          const int64_t g = o / opg;
          T* dst = out.data + (i * out_c + o) * plane;
          for (int64_t p = 0; p < plane; ++p) dst[p] = b[o];
          for (int64_t k = 0; k < cpg * taps; ++k) {  // weight[o] is [C / groups, kh, kw] = cpg * taps values
            const T wv = w[o * cpg * taps + k];
            const T* col = columns.data() + (g * cpg * taps + k) * plane;
            for (int64_t p = 0; p < plane; ++p) dst[p] += wv * col[p];
          }
        }
      }
    });
    return Status::OK();
  }

  Status Compute(Context& ctx) const {
    const TensorView &input = ctx.input(0), &weight = ctx.input(1), &offset = ctx.input(2), &mask = ctx.input(3),
                     &bias = ctx.input(4);
    OPBRIDGE_RETURN_IF_ERROR(expect_rank(input, "input", 4));
    OPBRIDGE_RETURN_IF_ERROR(expect_rank(weight, "weight", 4));
    OPBRIDGE_RETURN_IF_ERROR(expect_rank(offset, "offset", 4));
    OPBRIDGE_RETURN_IF_ERROR(expect_rank(bias, "bias", 1));
    const int64_t n = input.shape[0], c = input.shape[1], out_c = weight.shape[0], kh = weight.shape[2],
                  kw = weight.shape[3];
    if (c % groups != 0 || c % offset_groups != 0 || out_c % groups != 0)
      return Fail("input 'input' has ", c, " channels and 'weight' ", out_c, " outputs: both must divide by groups (",
                  groups, "), the channels by offset_groups (", offset_groups, ")");
    if (weight.shape[1] != c / groups)
      return Fail("input 'weight' must be [O, ", c / groups, ", kh, kw], got ", shape_str(weight.shape));
    if (bias.shape[0] != out_c) return Fail("input 'bias' must be [", out_c, "], got ", shape_str(bias.shape));
    const int64_t oh = out_size(input.shape[2], pad_h, dilation_h, kh, stride_h);
    const int64_t ow = out_size(input.shape[3], pad_w, dilation_w, kw, stride_w);
    if (oh <= 0 || ow <= 0) return Fail("input 'input' ", shape_str(input.shape), " is smaller than the kernel");
    const std::vector<int64_t> want_offset{n, offset_groups * 2 * kh * kw, oh, ow};
    if (offset.shape != want_offset)
      return Fail("input 'offset' must be ", shape_str(want_offset), ", got ", shape_str(offset.shape));
    if (use_mask) {
      const std::vector<int64_t> want_mask{n, offset_groups * kh * kw, oh, ow};
      if (mask.shape != want_mask) return Fail("input 'mask' must be ", shape_str(want_mask), ", got ", shape_str(mask.shape));
    }
    for (const TensorView* t : {&weight, &offset, &bias})
      if (t->dtype != input.dtype) return Fail("every input must have the dtype of 'input' (", dtype_name(input.dtype), ")");
    if (use_mask && mask.dtype != input.dtype) return Fail("input 'mask' must have the dtype of 'input'");
    if (input.dtype == DType::kFloat) return Run<float>(ctx, oh, ow);
    if (input.dtype == DType::kDouble) return Run<double>(ctx, oh, ow);
    return Fail("input 'input' must be float32 or float64, got ", dtype_name(input.dtype));
  }
};

}  // namespace

extern const KernelDef kernel_torchvision_op_deform_conv2d = make_kernel<DeformConv2d>();

}  // namespace opbridge
