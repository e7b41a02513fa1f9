"""A tiny GPT-2 (transformers GPT2LMHeadModel) with a dynamic sequence length.

Shows a decoder with learned position embeddings, LayerNorm, fused QKV projections (Conv1D, a
transposed linear), tanh-approximated GELU and causal attention, with the sequence dim in
[2, 512]. Weights are random (seeded); nothing is downloaded.

    dayzero compile examples/gpt2.py:build -o gpt2.dz
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

MAX_SEQ = 512


class LMHead(nn.Module):
    """input_ids -> logits, with the KV cache off and a plain tensor output."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False, return_dict=True).logits


def build():
    """hidden 64, 2 layers, 4 heads, vocab 256; input_ids [1, seq] with seq in [2, 512]."""
    cfg = GPT2Config(n_embd=64, n_layer=2, n_head=4, n_inner=128, vocab_size=256,
                     n_positions=MAX_SEQ, bos_token_id=255, eos_token_id=255, use_cache=False,
                     attn_implementation="sdpa")
    torch.manual_seed(0)  # before construction: the random init is the same on every call
    model = LMHead(GPT2LMHeadModel(cfg).eval())
    input_ids = torch.randint(0, cfg.vocab_size, (1, 8), generator=torch.Generator().manual_seed(1))
    seq = torch.export.Dim("seq", min=2, max=MAX_SEQ)
    return model, (input_ids,), ({1: seq},)
