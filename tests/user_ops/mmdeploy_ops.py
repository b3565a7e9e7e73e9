# mmdeploy_ops.py
"""mmdeploy's grid_sampler as mmdeploy writes it: a torch.autograd.Function whose symbolic writes the
mmdeploy::grid_sampler node (mmdeploy/pytorch/symbolics/grid_sampler.py writes the same node for
aten::grid_sampler), bridged with bridge.register, and a small model using it (conv -> grid_sampler -> relu)."""
import torch
import torch.nn.functional as F

import bridge

MODES = ("bilinear", "nearest", "bicubic")  # interpolation_mode 0, 1, 2 (aten's numbering, and mmdeploy's)
PADDINGS = ("zeros", "border", "reflection")  # padding_mode 0, 1, 2


class GridSampler(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, grid, interpolation_mode, padding_mode, align_corners=False):
        return F.grid_sample(input, grid, mode=MODES[interpolation_mode], padding_mode=PADDINGS[padding_mode],
                             align_corners=bool(align_corners))

    @staticmethod
    def symbolic(g, input, grid, interpolation_mode, padding_mode, align_corners=False):
        return g.op("mmdeploy::grid_sampler", input, grid, interpolation_mode_i=interpolation_mode,
                    padding_mode_i=padding_mode, align_corners_i=align_corners)


def _samples(dtype):
    return [bridge.SampleInput((torch.randn(2, 3, 5, 6, dtype=dtype), torch.rand(2, 4, 7, 2, dtype=dtype) * 2.4 - 1.2,
                                0, 0, False))]


bridge.register(GridSampler, sample_inputs=_samples)  # the node is symbolic's: mmdeploy::grid_sampler
grid_sampler = GridSampler.apply


class Warp(torch.nn.Module):
    def __init__(self, interpolation_mode=0, padding_mode=0, align_corners=False):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.modes = (interpolation_mode, padding_mode, align_corners)

    def forward(self, x, grid):
        return torch.relu(grid_sampler(self.conv(x), grid, *self.modes))


def case(interpolation_mode=0, padding_mode=0, align_corners=False):
    """The model, inputs for batch 2 and batch 3 (the batch is dynamic), for `opbridge check --model`."""
    torch.manual_seed(0)
    batch = torch.export.Dim("batch")
    inputs = [(torch.randn(n, 3, 8, 8), torch.rand(n, 5, 6, 2) * 2.4 - 1.2) for n in (2, 3)]
    return bridge.testing.ModelCase(Warp(interpolation_mode, padding_mode, align_corners).eval(), inputs[0],
                                    dynamic_shapes=({0: batch}, {0: batch}), extra_args=inputs[1:])
