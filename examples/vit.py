"""A tiny Vision Transformer (transformers ViTModel) with a dynamic batch size.

Shows an image model: a strided conv patch embedding, a class token, learned position
embeddings, pre-LayerNorm encoder blocks, on 32x32 RGB images in batches of [1, 16].
Weights are random (seeded); nothing is downloaded.

    dayzero compile examples/vit.py:build -o vit.dz
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import ViTConfig, ViTModel


class Encoder(nn.Module):
    """pixel_values -> last_hidden_state as a plain tensor."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values, return_dict=True).last_hidden_state


def build():
    """hidden 64, 2 layers, 4 heads, 8x8 patches; pixel_values [batch, 3, 32, 32]."""
    cfg = ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=128, image_size=32, patch_size=8, num_channels=3,
                    attn_implementation="sdpa")
    torch.manual_seed(0)  # before construction: the random init is the same on every call
    model = Encoder(ViTModel(cfg, add_pooling_layer=False).eval())
    pixel_values = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    batch = torch.export.Dim("batch", min=1, max=16)
    return model, (pixel_values,), ({0: batch},)
