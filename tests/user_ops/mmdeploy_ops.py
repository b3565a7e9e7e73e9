# mmdeploy_ops.py
"""mmdeploy's grid_sampler node as a bridge op, and a small model using it (conv -> grid_sampler -> relu)."""
import torch
import torch.nn.functional as F

import bridge

MODES = ("bilinear", "nearest", "bicubic")  # interpolation_mode 0, 1, 2 (mmdeploy's numbering)
PADDINGS = ("zeros", "border", "reflection")  # padding_mode 0, 1, 2


def _fake(input, grid, interpolation_mode, padding_mode, align_corners):
    return input.new_empty(input.shape[0], input.shape[1], grid.shape[1], grid.shape[2])


@bridge.op("mmdeploy::grid_sampler", fake=_fake, dtypes=(torch.float32,),
           sample_inputs=lambda dtype: [bridge.SampleInput((torch.randn(2, 3, 5, 6, dtype=dtype),
                                                            torch.rand(2, 4, 7, 2, dtype=dtype) * 2.4 - 1.2, 0, 0, 0))])
def grid_sampler(input: torch.Tensor, grid: torch.Tensor, interpolation_mode: int, padding_mode: int,
                 align_corners: int) -> torch.Tensor:
    """F.grid_sample with mmdeploy's int attributes (the node mmdeploy's symbolic writes)."""
    return F.grid_sample(input, grid, mode=MODES[interpolation_mode], padding_mode=PADDINGS[padding_mode],
                         align_corners=bool(align_corners))


class Warp(torch.nn.Module):
    def __init__(self, interpolation_mode=0, padding_mode=0, align_corners=0):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.modes = (interpolation_mode, padding_mode, align_corners)

    def forward(self, x, grid):
        return torch.relu(grid_sampler(self.conv(x), grid, *self.modes))


def case(interpolation_mode=0, padding_mode=0, align_corners=0):
    """The model, inputs for batch 2 and batch 3 (the batch is dynamic), for `opbridge check --model`."""
    torch.manual_seed(0)
    batch = torch.export.Dim("batch")
    inputs = [(torch.randn(n, 3, 8, 8), torch.rand(n, 5, 6, 2) * 2.4 - 1.2) for n in (2, 3)]
    return bridge.testing.ModelCase(Warp(interpolation_mode, padding_mode, align_corners).eval(), inputs[0],
                                    dynamic_shapes=({0: batch}, {0: batch}), extra_args=inputs[1:])
