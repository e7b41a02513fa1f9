"""A tiny Llama decoder (transformers LlamaForCausalLM) with a dynamic sequence length.

Shows the ops a modern decoder needs (embedding, rms_norm, rotary embeddings, grouped-query
scaled_dot_product_attention with a causal mask, SiLU-gated MLP) and a symbolic sequence dim in
[2, 512]. Weights are random (seeded); nothing is downloaded.

    dayzero compile examples/llama.py:build -o llama.dz
    dayzero compile examples/llama.py:build_bench -o llama_bench.dz   # the benchmark decoder
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

MAX_SEQ = 512


class CausalLM(nn.Module):
    """input_ids -> logits, with the KV cache off and a plain tensor output."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False, return_dict=True).logits


def config(hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2,
           intermediate: int = 172, vocab: int = 256) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, intermediate_size=intermediate, vocab_size=vocab,
        max_position_embeddings=MAX_SEQ, use_cache=False, attn_implementation="sdpa",
        tie_word_embeddings=False,
    )


def _spec(cfg: LlamaConfig, seq: int):
    torch.manual_seed(0)  # before construction: the random init is the same on every call
    model = CausalLM(LlamaForCausalLM(cfg).eval())
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, cfg.vocab_size, (1, seq), generator=generator)
    seq_dim = torch.export.Dim("seq", min=2, max=MAX_SEQ)
    return model, (input_ids,), ({1: seq_dim},)


def build():
    """Tiny decoder: hidden 64, 2 layers, 4 heads (2 KV heads), vocab 256; input_ids [1, seq]."""
    return _spec(config(), seq=8)


def build_bench():
    """Benchmark decoder: hidden 256, 4 layers, 8 heads (4 KV), intermediate 688, vocab 1000."""
    cfg = config(hidden=256, layers=4, heads=8, kv_heads=4, intermediate=688, vocab=1000)
    return _spec(cfg, seq=32)
