"""A third-party package's ops written in plain PyTorch; it knows nothing of opbridge."""

import torch


@torch.library.custom_op("vendor_plain::gated_pool", mutates_args=())
def gated_pool(x: torch.Tensor, index: torch.Tensor, k: int, gain: float, window: list[int]) -> torch.Tensor:
    """Rows of ``x`` picked by ``index`` (duplicates add up), times ``k``, plus a softmax score of
    the columns ``window[0]:-window[1]`` scaled by ``gain``."""
    lo, hi = window
    scores = torch.softmax(x[:, lo:x.shape[1] - hi] * gain, dim=-1).amax(-1, keepdim=True)
    picked = torch.zeros_like(x).index_add_(0, index, x.index_select(0, index) * k)
    return picked + scores


@gated_pool.register_fake
def _(x, index, k, gain, window):
    return torch.empty_like(x)


# NOTE: an op defined the C++ way (a schema, then a composite kernel): its body is the decomposition
_lib = torch.library.Library("vendor_plain", "DEF")
_lib.define("soft_clip(Tensor x, float limit) -> Tensor")
_lib.impl("soft_clip", lambda x, limit: limit * torch.tanh(x / limit), "CompositeImplicitAutograd")
