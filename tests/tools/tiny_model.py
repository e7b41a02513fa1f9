"""A tiny self-attention block for the alignment tests: linear, layer_norm, softmax, matmul."""

from __future__ import annotations

import torch
from torch import nn


class TinyAttention(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.proj(x))
        weights = torch.softmax(h @ h.transpose(-1, -2), dim=-1)
        return x + weights @ h


def build():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))
    return TinyAttention().eval(), (x,), ({1: torch.export.Dim("seq", min=2, max=64)},)
