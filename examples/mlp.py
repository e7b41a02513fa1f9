"""A plain MLP (Linear / GELU / LayerNorm) with a dynamic batch size.

The smallest model dayzero compiles: it shows the `build()` spec contract, a dynamic batch dim
(torch.export.Dim with an explicit range) and the linear / gelu / layer_norm ops.

    dayzero compile examples/mlp.py:build -o mlp.dz
"""

from __future__ import annotations

import torch
from torch import nn

IN_FEATURES = 32
HIDDEN = 64
OUT_FEATURES = 16


def build():
    """Returns (model, example_inputs, dynamic_shapes) with batch in [1, 1024]."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(IN_FEATURES, HIDDEN),
        nn.GELU(),
        nn.LayerNorm(HIDDEN),
        nn.Linear(HIDDEN, HIDDEN),
        nn.GELU(),
        nn.Linear(HIDDEN, OUT_FEATURES),
    ).eval()
    x = torch.randn(4, IN_FEATURES)
    batch = torch.export.Dim("batch", min=1, max=1024)
    return model, (x,), ({0: batch},)
