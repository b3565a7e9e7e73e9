"""Ops written like torchvision's C++ ops (``roi_align``, ``nms``, ``deform_conv2d``): the same names and
schemas (those onnxscript's torch_lib keys its translations by), a CPU kernel each (plain torch, the
algorithm of torchvision's CPU kernels) and a fake kernel each (nms: a data-dependent output size), no
ONNX code. ``define(ns)`` defines them in namespace ``ns`` once per process (torch ops cannot be
undefined)."""

from __future__ import annotations

import math

import torch

SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align": "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
                 "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor",
    "deform_conv2d": "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
                     "SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, "
                     "SymInt dilation_w, SymInt groups, SymInt offset_groups, bool use_mask) -> Tensor",
}
_LIBS: dict[str, torch.library.Library] = {}


def nms(dets: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy NMS as torchvision's CPU kernel: by descending score, drop boxes whose IoU with a kept
    box is > iou_threshold; the kept indices (int64)."""
    x1, y1, x2, y2 = dets.unbind(1)
    areas = (x2 - x1) * (y2 - y1)
    suppressed = torch.zeros(len(dets), dtype=torch.bool)
    keep = []
    for i in scores.argsort(descending=True, stable=True).tolist():
        if suppressed[i]:
            continue
        keep.append(i)
        w = (torch.minimum(x2[i], x2) - torch.maximum(x1[i], x1)).clamp(min=0)
        h = (torch.minimum(y2[i], y2) - torch.maximum(y1[i], y1)).clamp(min=0)
        inter = w * h
        suppressed |= inter / (areas[i] + areas - inter) > iou_threshold
    return torch.tensor(keep, dtype=torch.int64)


def _nms_fake(dets, scores, iou_threshold):
    return dets.new_empty(torch.library.get_ctx().new_dynamic_size(), dtype=torch.int64)


def _bilinear_roi(img: torch.Tensor, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """torchvision's roi_align bilinear_interpolate at points (y, x) of ``img`` [C, H, W]: [C, *y.shape]."""
    height, width = img.shape[-2:]
    outside = (y < -1.0) | (y > height) | (x < -1.0) | (x > width)
    y, x = y.clamp(min=0), x.clamp(min=0)
    y_low, x_low = y.floor().long(), x.floor().long()
    y_top, x_top = y_low >= height - 1, x_low >= width - 1
    y_low, x_low = torch.where(y_top, height - 1, y_low), torch.where(x_top, width - 1, x_low)
    y_high, x_high = torch.where(y_top, y_low, y_low + 1), torch.where(x_top, x_low, x_low + 1)
    y, x = torch.where(y_top, y_low.to(y.dtype), y), torch.where(x_top, x_low.to(x.dtype), x)
    ly, lx = y - y_low, x - x_low
    hy, hx = 1 - ly, 1 - lx
    val = (hy * hx * img[:, y_low, x_low] + hy * lx * img[:, y_low, x_high]
           + ly * hx * img[:, y_high, x_low] + ly * lx * img[:, y_high, x_high])
    return torch.where(outside, 0.0, val)


def roi_align(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    """RoIAlign as torchvision's CPU kernel (average of bilinear samples; ``sampling_ratio <= 0``:
    adaptive, ceil(roi size / pooled size) samples per bin)."""
    offset = 0.5 if aligned else 0.0
    out = input.new_zeros(len(rois), input.shape[1], pooled_height, pooled_width)
    for k, roi in enumerate(rois.tolist()):
        x1, y1, x2, y2 = (v * spatial_scale - offset for v in roi[1:])
        roi_w, roi_h = x2 - x1, y2 - y1
        if not aligned:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        bin_h, bin_w = roi_h / pooled_height, roi_w / pooled_width
        grid_h = sampling_ratio if sampling_ratio > 0 else math.ceil(roi_h / pooled_height)
        grid_w = sampling_ratio if sampling_ratio > 0 else math.ceil(roi_w / pooled_width)
        count = max(grid_h * grid_w, 1)
        ph = torch.arange(pooled_height, dtype=input.dtype)[:, None]
        pw = torch.arange(pooled_width, dtype=input.dtype)[:, None]
        iy = (torch.arange(grid_h, dtype=input.dtype) + 0.5) / grid_h
        ix = (torch.arange(grid_w, dtype=input.dtype) + 0.5) / grid_w
        ys = (y1 + (ph + iy) * bin_h)[:, None, :, None]  # [ph, 1, gh, 1]
        xs = (x1 + (pw + ix) * bin_w)[None, :, None, :]  # [1, pw, 1, gw]
        ys, xs = torch.broadcast_tensors(ys, xs)
        vals = _bilinear_roi(input[int(roi[0])], ys, xs)  # [C, ph, pw, gh, gw]
        out[k] = vals.sum((-1, -2)) / count
    return out


def _roi_align_fake(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    torch._check(rois.shape[1] == 5)
    return input.new_empty(rois.shape[0], input.shape[1], pooled_height, pooled_width)


def _bilinear_deform(img: torch.Tensor, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """torchvision's deform_conv2d bilinear_interpolate: img [N, C, H, W], y/x [N, P...] -> [N, C, P...];
    0 outside (-1, size), each corner read only inside the image."""
    n, c, height, width = img.shape
    inside = (y > -1) & (y < height) & (x > -1) & (x < width)
    y_low, x_low = y.floor().long(), x.floor().long()
    ly, lx = y - y_low, x - x_low
    flat = img.reshape(n, c, -1)
    out = 0
    for yy, xx, wgt in ((y_low, x_low, (1 - ly) * (1 - lx)), (y_low, x_low + 1, (1 - ly) * lx),
                        (y_low + 1, x_low, ly * (1 - lx)), (y_low + 1, x_low + 1, ly * lx)):
        ok = inside & (yy >= 0) & (yy < height) & (xx >= 0) & (xx < width)
        index = (yy.clamp(0, height - 1) * width + xx.clamp(0, width - 1)).reshape(n, 1, -1).expand(n, c, -1)
        vals = flat.gather(2, index).reshape(n, c, *y.shape[1:])
        out = out + torch.where(ok[:, None], vals * wgt[:, None], 0.0)
    return out


def _out_size(size, pad, dilation, kernel, stride):
    return (size + 2 * pad - (dilation * (kernel - 1) + 1)) // stride + 1


def deform_conv2d(input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
                  groups, offset_groups, use_mask):
    """Deformable convolution v2 as torchvision's CPU kernel (bilinear samples at offset positions,
    modulated by ``mask`` when ``use_mask``, then a grouped convolution)."""
    n, c, height, width = input.shape
    out_c, _, kh, kw = weight.shape
    oh, ow = _out_size(height, pad_h, dilation_h, kh, stride_h), _out_size(width, pad_w, dilation_w, kw, stride_w)
    off = offset.reshape(n, offset_groups, kh * kw, 2, oh, ow)
    base_y = (torch.arange(oh) * stride_h - pad_h)[:, None].to(input.dtype)
    base_x = (torch.arange(ow) * stride_w - pad_w)[None, :].to(input.dtype)
    cg = c // offset_groups
    columns = []
    for g in range(offset_groups):
        per_k = []
        for k in range(kh * kw):
            i, j = divmod(k, kw)
            y = base_y + i * dilation_h + off[:, g, k, 0]
            x = base_x + j * dilation_w + off[:, g, k, 1]
            v = _bilinear_deform(input[:, g * cg:(g + 1) * cg], y, x)  # [N, cg, oh, ow]
            if use_mask:
                v = v * mask.reshape(n, offset_groups, kh * kw, oh, ow)[:, g, k][:, None]
            per_k.append(v)
        columns.append(torch.stack(per_k, 2))  # [N, cg, K, oh, ow]
    cols = torch.cat(columns, 1).reshape(n, groups, c // groups, kh * kw, oh, ow)
    w = weight.reshape(groups, out_c // groups, c // groups, kh * kw)
    out = torch.einsum("ngckhw,gock->ngohw", cols, w).reshape(n, out_c, oh, ow)
    return out + bias.reshape(1, -1, 1, 1)


def _deform_fake(input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
                 groups, offset_groups, use_mask):
    kh, kw = weight.shape[-2:]
    return input.new_empty(input.shape[0], weight.shape[0], _out_size(input.shape[2], pad_h, dilation_h, kh, stride_h),
                           _out_size(input.shape[3], pad_w, dilation_w, kw, stride_w))


_KERNELS = {"nms": (nms, _nms_fake), "roi_align": (roi_align, _roi_align_fake),
            "deform_conv2d": (deform_conv2d, _deform_fake)}


def define(ns: str) -> None:
    """Define the three ops in namespace ``ns`` (CPU and fake kernels), once per process."""
    if ns in _LIBS:
        return
    lib = _LIBS[ns] = torch.library.Library(ns, "FRAGMENT")
    for name, schema in SCHEMAS.items():
        kernel, fake = _KERNELS[name]
        lib.define(schema)
        lib.impl(name, kernel, "CPU")
        torch.library.register_fake(f"{ns}::{name}", fake, lib=lib)
