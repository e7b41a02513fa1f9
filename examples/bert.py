"""A tiny BERT encoder (transformers BertModel) with dynamic batch and sequence length.

Shows a bidirectional encoder: word + position + token-type embeddings, post-LayerNorm blocks,
erf GELU, and a padding attention mask turned into an additive mask, with batch in [1, 16] and
sequence in [2, 512]. Weights are random (seeded); nothing is downloaded.

    dayzero compile examples/bert.py:build -o bert.dz
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import BertConfig, BertModel

MAX_SEQ = 512


class Encoder(nn.Module):
    """(input_ids, attention_mask) -> last_hidden_state as a plain tensor."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        return out.last_hidden_state


def build():
    """hidden 64, 2 layers, 4 heads, vocab 256; input_ids and attention_mask [batch, seq]."""
    cfg = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, vocab_size=256, max_position_embeddings=MAX_SEQ,
                     attn_implementation="sdpa")
    torch.manual_seed(0)  # before construction: the random init is the same on every call
    model = Encoder(BertModel(cfg, add_pooling_layer=False).eval())
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, cfg.vocab_size, (2, 8), generator=generator)
    attention_mask = torch.ones(2, 8, dtype=torch.int64)
    attention_mask[1, 6:] = 0  # the second sequence is padded
    batch = torch.export.Dim("batch", min=1, max=16)
    seq = torch.export.Dim("seq", min=2, max=MAX_SEQ)
    dims = {0: batch, 1: seq}
    return model, (input_ids, attention_mask), (dims, dims)
