"""A model with a custom op (torch.library) that dayzero has no conversion for.

`dayzero coverage tests/tools/custom_op_model.py:build` reports `dayzero_demo.clipped_swish`
as missing on every backend and exits 1; the rest of the model is covered.
"""

from __future__ import annotations

import torch
from torch import nn


@torch.library.custom_op("dayzero_demo::clipped_swish", mutates_args=())
def clipped_swish(x: torch.Tensor, limit: float) -> torch.Tensor:
    return torch.clamp(x * torch.sigmoid(x), -limit, limit)


@clipped_swish.register_fake
def _(x: torch.Tensor, limit: float) -> torch.Tensor:
    return torch.empty_like(x)


class CustomBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.down = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = clipped_swish(self.up(x), 4.0)
        return x + self.down(self.norm(h))


def build():
    torch.manual_seed(0)
    return CustomBlock().eval(), (torch.randn(2, 16),)
