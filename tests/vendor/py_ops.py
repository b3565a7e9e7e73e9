"""A third-party package's op, written with torch.library.custom_op; knows nothing of opbridge."""

import torch

CALLS = {"swish": 0}  # how often torch ran this package's own kernel


@torch.library.custom_op("vendor::swish", mutates_args=())
def swish(x: torch.Tensor, beta: float) -> torch.Tensor:
    CALLS["swish"] += 1
    return x * torch.sigmoid(beta * x)


@swish.register_fake
def _(x, beta):
    return torch.empty_like(x)
