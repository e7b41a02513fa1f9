"""transformers' MixtralForCausalLM, tiny (hidden 32, 2 layers, 4 experts top-2), for the
expert-parallel tests: exported once per test process, compiled for one device and partitioned."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

TINY = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=64, num_local_experts=4, num_experts_per_tok=2)
SEQ = 11  # odd: the two ranks dispatch token slices of 5 and 6


@functools.cache
def _mixtral():
    """(IR text after export, weights, the eager model)."""
    from torch.export import Dim
    from transformers import AutoConfig, AutoModelForCausalLM

    from compiler import export
    from compiler.hf_models import wrap_pretrained
    from compiler.ir import print_ir

    config = AutoConfig.for_model("mixtral", **TINY)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config).eval()
    module, inputs = wrap_pretrained(hf, {"input_ids": torch.randint(0, 64, (1, 8))}, "mixtral")
    graph = export(module, inputs, ({1: Dim("seq", max=64)},))
    weights = {k: torch.as_tensor(v).clone() for k, v in graph.weight_data.items()}
    return print_ir(graph), weights, hf


def token_ids(seq: int) -> np.ndarray:
    return np.random.default_rng(seq).integers(0, 64, (1, seq))


def eager_logits(ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return _mixtral()[2](input_ids=torch.as_tensor(ids), use_cache=False).logits.numpy()


def mixtral_graph():
    """A fresh IR graph of the exported model, with its weights."""
    from compiler.ir import parse_ir

    text, weights, _ = _mixtral()
    graph = parse_ir(text)
    graph.weight_data.update(weights)
    return graph


def compile_mixtral(out: Path, parallel: dict[str, int] | None = None,
                    backend: str = "onnxruntime") -> Path:
    """The tiny Mixtral as an artifact: one device (the backend's own pipeline) or partitioned
    over `parallel` (the default pipeline with the MoE blocks fused)."""
    from compiler.config import load_config
    from compiler.driver import _backend, lower_and_write
    from compiler.log import SILENT

    config = load_config({"parallel": parallel or {}})
    return lower_and_write(mixtral_graph(), out, _backend(backend), config, passes=None,
                           dump_ir=None, force=False, log=SILENT)
