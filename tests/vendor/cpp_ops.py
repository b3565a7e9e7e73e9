"""A third-party C++ op (TORCH_LIBRARY + TORCH_LIBRARY_IMPL), built with load_inline and cached;
its fake kernel is registered from Python, as C++ op packages do. Knows nothing of opbridge."""

import hashlib
import os
import tempfile
from pathlib import Path

import torch
from torch._library import simple_registry
from torch.utils import cpp_extension

SOURCE = r"""
#include <torch/library.h>
#include <ATen/ATen.h>

// out0 = x * scale + sum(offsets); out1 = the first k columns of x (int64 positions of its max)
std::tuple<at::Tensor, at::Tensor> affine_head(const at::Tensor& x, int64_t k, double scale,
                                               c10::IntArrayRef offsets) {
  TORCH_CHECK(x.dim() == 2, "vendorcpp::affine_head: x must be 2-D, got ", x.dim(), "-D");
  TORCH_CHECK(k >= 0 && k <= x.size(1), "vendorcpp::affine_head: k must be in [0, ", x.size(1), "], got ", k);
  int64_t total = 0;
  for (auto o : offsets) total += o;
  return {x * scale + static_cast<double>(total), x.narrow(1, 0, k).argmax(1)};
}

at::Tensor scale_shift(const at::Tensor& x, double scale, double shift) { return x * scale + shift; }

TORCH_LIBRARY(vendorcpp, m) {
  m.def("affine_head(Tensor x, int k, float scale, int[] offsets) -> (Tensor, Tensor)");
  m.def("scale_shift(Tensor x, float scale, float shift) -> Tensor");
}

TORCH_LIBRARY_IMPL(vendorcpp, CPU, m) {
  m.impl("affine_head", &affine_head);
  m.impl("scale_shift", &scale_shift);
}
"""


def build() -> Path:
    """Build the library once (cached) and load it into this process; return its path.

    NOTE: each build runs in a folder of its own and the library is renamed into the cache when
    done: torch's lock file in a shared build folder, left by a killed build, blocks every later one.
    """
    key = hashlib.sha256(SOURCE.encode() + torch.__version__.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("OPBRIDGE_CACHE_DIR") or Path.home() / ".cache" / "opbridge") / "test_vendorcpp"
    target = cache / key / "vendorcpp.so"
    if torch._C._jit_get_schemas_for_operator("vendorcpp::affine_head"):
        return target
    if target.is_file():
        torch.ops.load_library(str(target))
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cpp_extension.load_inline("vendorcpp", cpp_sources=SOURCE, build_directory=tmp,
                                  is_python_module=False, verbose=False)
        os.replace(Path(tmp) / "vendorcpp.so", target)
    return target


def load() -> None:
    """Build and load the library; register the fake kernel of affine_head from Python (once, whoever
    loaded the library first)."""
    build()
    if simple_registry.singleton.find("vendorcpp::affine_head").fake_impl.kernel is None:
        torch.library.register_fake("vendorcpp::affine_head", _affine_head_fake)


def _affine_head_fake(x, k, scale, offsets):
    return torch.empty_like(x), x.new_empty((x.shape[0],), dtype=torch.int64)
