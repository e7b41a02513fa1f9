"""How far a quantized peer's logits are from fp32 on the same checkpoint and prompts.

benchmarks/generate.py reports it beside the int4 decode times: a coarser quantization block
(fewer scale bytes to read per token) is only a fair win when its error stays comparable to the
int4 peer's. Each peer gives the last position's logits of the same prompts (ONNX Runtime
GenAI hands back only those); transformers' eager fp32 forward is the reference.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def last_logits(peer: str, path: str, prompts: list[list[int]]) -> np.ndarray:
    """[prompts, vocab] float32: each prompt's last-position logits from `peer` at `path`."""
    rows = [_LOGITS[_kind(peer)](path, ids) for ids in prompts]
    return np.stack([np.asarray(r, np.float32).reshape(-1) for r in rows])


def error_figures(reference: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """Relative RMS error (||got - ref|| / ||ref|| over every row), the largest absolute
    error, and how often the top token agrees; NaN anywhere makes the error NaN."""
    diff = got.astype(np.float64) - reference.astype(np.float64)
    return {"rel_rms": float(np.sqrt((diff ** 2).sum() / (reference.astype(np.float64) ** 2)
                                     .sum())),
            "max_abs": float(np.abs(diff).max()),
            "top1": float((got.argmax(axis=1) == reference.argmax(axis=1)).mean())}


def _kind(peer: str) -> str:
    return "dayzero" if peer.startswith("dayzero") else peer.split("-")[0]


def _transformers(path: str, ids: list[int]) -> np.ndarray:
    import torch
    from transformers import LlamaForCausalLM

    model = _cached(path, lambda: LlamaForCausalLM.from_pretrained(path).eval())
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1].numpy()


def _dayzero(path: str, ids: list[int]) -> np.ndarray:
    import runtime

    model = _cached(path, lambda: runtime.load(path))
    return model(np.asarray([ids], np.int64))[0][0, -1]


def _genai(path: str, ids: list[int]) -> np.ndarray:
    os.environ["ORT_DISABLE_TELEMETRY"] = "1"  # before GenAI loads onnxruntime
    import onnxruntime_genai as og

    model = _cached(path, lambda: og.Model(path))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + 1, batch_size=1)
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray([ids], np.int32))
    return generator.get_logits()


_LOADED: dict[str, object] = {}
_LOGITS = {"transformers": _transformers, "dayzero": _dayzero, "genai": _genai}


def _cached(path: str, load):
    if path not in _LOADED:
        _LOADED[path] = load()
    return _LOADED[path]


def save(peer: str, path: str, prompts: list[list[int]], out: str) -> None:
    np.save(Path(out), last_logits(peer, path, prompts))
