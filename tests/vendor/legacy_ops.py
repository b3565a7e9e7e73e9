"""A C++ op library in the style of torch-scatter 2.1.2, built with load_inline and cached; knows
nothing of opbridge.

- ``legacy_scatter::scatter_sum`` / ``scatter_max`` are registered with the old
  ``torch::RegisterOperators().op(name, &fn)`` API: the schema is inferred from the C++ signature
  (arguments ``_0``, ``_1``, ...) and the only kernel is CompositeImplicitAutograd, as torch-scatter's.
  Semantics of torch-scatter: ``out[index[i]] (+)= src[i]`` along ``dim`` (a 1-D index broadcasts
  over the trailing dims), ``dim_size`` defaults to ``index.max() + 1``; max returns the first
  argmax, empty slots 0 with argmax ``src.size(dim)``. A given ``out`` is accumulated into (a copy).
- ``legacy_scatter::Affine`` is a torchbind class with state (``scale``, ``shift``) and one method
  ``forward(x) = x * scale + shift``; no op stands for it.
"""

import hashlib
import os
import tempfile
from pathlib import Path

import torch
from torch.utils import cpp_extension

SOURCE = r"""
#include <torch/script.h>
#include <torch/custom_class.h>
#include <optional>
#include <limits>

static int64_t n_sum = 0, n_max = 0;

static torch::Tensor broadcast(torch::Tensor index, const torch::Tensor& src, int64_t dim) {
  if (index.dim() == 1)
    for (int64_t i = 0; i < dim; ++i) index = index.unsqueeze(0);
  for (int64_t i = index.dim(); i < src.dim(); ++i) index = index.unsqueeze(-1);
  return index.expand_as(src);
}

static std::vector<int64_t> out_sizes(const torch::Tensor& src, const torch::Tensor& index, int64_t dim,
                                      std::optional<int64_t> dim_size) {
  auto sizes = src.sizes().vec();
  if (dim_size.has_value()) sizes[dim] = *dim_size;
  else sizes[dim] = index.numel() == 0 ? 0 : index.max().item<int64_t>() + 1;
  return sizes;
}

torch::Tensor scatter_sum(torch::Tensor src, torch::Tensor index, int64_t dim,
                          std::optional<torch::Tensor> optional_out, std::optional<int64_t> dim_size) {
  ++n_sum;
  if (dim < 0) dim += src.dim();
  index = broadcast(index, src, dim);
  torch::Tensor out = optional_out.has_value() ? optional_out->clone()
                                               : torch::zeros(out_sizes(src, index, dim, dim_size), src.options());
  return out.scatter_add_(dim, index, src);
}

std::tuple<torch::Tensor, torch::Tensor> scatter_max(torch::Tensor src, torch::Tensor index, int64_t dim,
                                                     std::optional<torch::Tensor> optional_out,
                                                     std::optional<int64_t> dim_size) {
  ++n_max;
  if (dim < 0) dim += src.dim();
  index = broadcast(index, src, dim).contiguous();
  torch::Tensor s = src.contiguous();
  auto sizes = optional_out.has_value() ? optional_out->sizes().vec() : out_sizes(src, index, dim, dim_size);
  int64_t n = s.size(dim), m = sizes[dim];
  torch::Tensor out = torch::full(sizes, -std::numeric_limits<float>::infinity(), src.options());
  torch::Tensor arg = torch::full(sizes, n, index.options());
  // plain loops over (outer, n, inner) as torch-scatter's CPU kernel: strictly greater updates
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= s.size(d);
  for (int64_t d = dim + 1; d < s.dim(); ++d) inner *= s.size(d);
  auto sp = s.data_ptr<float>(); auto ip = index.data_ptr<int64_t>();
  auto op = out.data_ptr<float>(); auto ap = arg.data_ptr<int64_t>();
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t e = 0; e < n; ++e)
      for (int64_t k = 0; k < inner; ++k) {
        int64_t j = ip[(o * n + e) * inner + k];
        TORCH_CHECK(j >= 0 && j < m, "scatter_max: index ", j, " out of range [0, ", m, ")");
        float v = sp[(o * n + e) * inner + k];
        int64_t t = (o * m + j) * inner + k;
        if (v > op[t]) { op[t] = v; ap[t] = e; }
      }
  out.masked_fill_(arg == n, 0);
  if (optional_out.has_value()) out = torch::maximum(out, *optional_out);
  return std::make_tuple(out, arg);
}

int64_t calls(int64_t which) { return which == 0 ? n_sum : n_max; }

static auto registry = torch::RegisterOperators()
    .op("legacy_scatter::scatter_sum", &scatter_sum)
    .op("legacy_scatter::scatter_max", &scatter_max)
    .op("legacy_scatter::calls", &calls);

struct Affine : torch::CustomClassHolder {
  double scale; int64_t shift;
  Affine(double s, int64_t b) : scale(s), shift(b) {}
  torch::Tensor forward(torch::Tensor x) { return x * scale + static_cast<double>(shift); }
  std::tuple<std::tuple<std::string, double>, std::tuple<std::string, int64_t>> __obj_flatten__() {
    return std::make_tuple(std::make_tuple(std::string("scale"), scale), std::make_tuple(std::string("shift"), shift));
  }
};

TORCH_LIBRARY(legacy_scatter, m) {
  m.class_<Affine>("Affine")
      .def(torch::init<double, int64_t>())
      .def("forward", &Affine::forward)
      .def("__obj_flatten__", &Affine::__obj_flatten__)
      .def_pickle([](const c10::intrusive_ptr<Affine>& self) { return std::make_tuple(self->scale, self->shift); },
                  [](std::tuple<double, int64_t> s) {
                    return c10::make_intrusive<Affine>(std::get<0>(s), std::get<1>(s)); });
}
"""
LIBRARY = "legacy_scatter"


def load() -> None:
    """Build once per source and torch version (cached under ``$OPBRIDGE_CACHE_DIR`` or
    ``~/.cache/opbridge``) and load the library into this process."""
    if torch._C._jit_get_schemas_for_operator("legacy_scatter::scatter_sum"):
        return
    key = hashlib.sha256(SOURCE.encode() + torch.__version__.encode()).hexdigest()[:16]
    folder = Path(os.environ.get("OPBRIDGE_CACHE_DIR") or Path.home() / ".cache" / "opbridge") / "test_legacy" / key
    built = folder / f"{LIBRARY}.so"
    if built.is_file():
        torch.ops.load_library(str(built))
        return
    # NOTE: each build in a folder of its own, renamed into the cache when done: torch's lock file in a
    # shared build folder, left by a killed build, blocks every later one
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        cpp_extension.load_inline(LIBRARY, cpp_sources=SOURCE, build_directory=tmp,
                                  is_python_module=False, verbose=False)
        os.replace(Path(tmp) / f"{LIBRARY}.so", built)


def calls(name: str) -> int:
    """How often the C++ kernel of ``name`` ran in this process."""
    return torch.ops.legacy_scatter.calls(0 if name == "scatter_sum" else 1)
