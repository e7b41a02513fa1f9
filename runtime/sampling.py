"""Choosing the next token from a step's logits: greedy, or sampled with temperature, top-k and
top-p, as transformers' `generate` does it.

numpy only (the runtime runs without torch). The filters follow transformers' logits warpers in
their order (temperature, then top-k, then top-p) and their tie rules: top-k keeps every token
at least as likely as the k-th; top-p sorts ascending, drops the tokens whose cumulative
probability stays at or under 1 - p, and always keeps the most likely one. Greedy is the first
maximum, as torch.argmax. Sampling draws from a numpy Generator seeded per call of `generate`,
so a seed reproduces a run. Logits with a NaN are an error, not a token: argmax would read NaN
as the maximum and sampling would silently skip it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.errors import InputError


@dataclass(frozen=True)
class SamplingParams:
    """What `generate(do_sample=..., temperature=..., top_k=..., top_p=..., seed=...)` takes."""
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        checks = [
            (isinstance(self.temperature, (int, float)) and self.temperature > 0
             and np.isfinite(self.temperature), "temperature", "a positive number"),
            (self.top_k is None or isinstance(self.top_k, (int, np.integer))
             and not isinstance(self.top_k, bool) and self.top_k >= 1, "top_k",
             "None or an integer >= 1"),
            (self.top_p is None or isinstance(self.top_p, (int, float))
             and 0 < self.top_p <= 1, "top_p", "None or a number in (0, 1]"),
            (self.seed is None or isinstance(self.seed, (int, np.integer))
             and not isinstance(self.seed, bool) and self.seed >= 0, "seed",
             "None or an integer >= 0"),
        ]
        for ok, name, want in checks:
            if not ok:
                raise InputError(f"{name}={getattr(self, name)!r} is not {want}", name,
                                 f"pass {name} as {want}")

    def generator(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)


def next_tokens(logits: np.ndarray, params: SamplingParams,
                rng: np.random.Generator | None = None) -> np.ndarray:
    """One token id per row of `logits` [batch, vocab] (int64)."""
    logits = np.asarray(logits)
    if logits.ndim != 2 or logits.shape[1] == 0:
        raise InputError(f"logits of shape {list(logits.shape)}, not [batch, vocab]", "logits",
                         "pass the last position's logits of each sequence")
    bad = np.isnan(logits.max(axis=1))  # max propagates NaN: one pass, no mask array
    if bad.any():
        raise InputError(f"the logits of sequence {int(np.argmax(bad))} contain NaN", "logits",
                         "the model produced NaN (check its inputs and weights: `dayzero align`)")
    if not params.do_sample:
        return np.argmax(logits, axis=1).astype(np.int64)
    probs = probabilities(logits, params)
    rng = rng if rng is not None else params.generator()
    draws = rng.random(len(probs))
    cumulative = np.cumsum(probs, axis=1)
    picks = (cumulative < draws[:, None] * cumulative[:, -1:]).sum(axis=1)
    return np.minimum(picks, probs.shape[1] - 1).astype(np.int64)


def probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The sampling distribution per row after temperature, top-k and top-p (float64)."""
    scores = np.asarray(logits, dtype=np.float64) / params.temperature
    if params.top_k is not None and params.top_k < scores.shape[1]:
        kth = -np.partition(-scores, params.top_k - 1, axis=1)[:, params.top_k - 1:params.top_k]
        scores = np.where(scores < kth, -np.inf, scores)
    if params.top_p is not None and params.top_p < 1:
        scores = _top_p(scores, params.top_p)
    shifted = np.exp(scores - scores.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def _top_p(scores: np.ndarray, top_p: float) -> np.ndarray:
    order = np.argsort(scores, axis=1, kind="stable")
    ordered = np.take_along_axis(scores, order, axis=1)
    exp = np.exp(ordered - ordered.max(axis=1, keepdims=True))
    cumulative = np.cumsum(exp / exp.sum(axis=1, keepdims=True), axis=1)
    drop_sorted = cumulative <= 1 - top_p
    drop_sorted[:, -1] = False  # the most likely token always stays
    drop = np.empty_like(drop_sorted)
    np.put_along_axis(drop, order, drop_sorted, axis=1)
    return np.where(drop, -np.inf, scores)
