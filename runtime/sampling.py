"""Choosing the next token from a step's logits: greedy, or sampled with temperature, top-k and
top-p, as transformers' `generate` does it, exact at every temperature.

numpy only (the runtime runs without torch). The filters follow transformers' logits warpers in
their order (temperature, then top-k, then top-p) and their tie rules: top-k keeps every token
at least as likely as the k-th; top-p sorts ascending, drops the tokens whose cumulative
probability stays at or under 1 - p, and always keeps the most likely one. Greedy is the first
maximum, as torch.argmax. Sampling draws from a numpy Generator seeded per call of `generate`,
so a seed reproduces a run.

Exactness. transformers divides the scores by the temperature first, so a tiny temperature
overflows them to inf and softmax returns NaN. Here everything is float64 and the row maximum
is subtracted BEFORE the division: (x - max) / T is <= 0 everywhere, the maxima are exactly 0,
and overflow can only reach -inf, where the exact probability rounds to 0 anyway. So T -> 0
gives the limit (one-hot on the maximum, uniform over tied maxima) and a huge T tends to
uniform over the tokens not masked. The filters order tokens by their logits, which is their
exact probability order at any temperature (the scaled scores may round distinct values into
ties), and top-p compares the mass above each token with p, not a cumulative sum with 1 - p
(which rounds p away when it is tiny).

A row that holds NaN or +inf, or is -inf everywhere, has no distribution: it is an error, never
a token. A -inf logit alone is a mask (a suppressed token) and is fine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from compiler.errors import InputError

SMALLEST_NORMAL = float(np.finfo(np.float64).tiny)  # 2.2250738585072014e-308


def is_greedy_temperature(temperature: float) -> bool:
    """Whether an HTTP request's temperature means greedy decoding: 0 (OpenAI's greedy) or a
    positive value below the smallest normal float64 (a subnormal, where 1 / T overflows and
    the distribution is the argmax's to the last bit). NaN and negatives are not: they are
    errors (`SamplingParams.for_request`)."""
    return 0 <= temperature < SMALLEST_NORMAL


@dataclass(frozen=True)
class SamplingParams:
    """What `generate(do_sample=..., temperature=..., top_k=..., top_p=..., seed=...)` takes.

    `do_sample=True` with temperature 0 is refused, as transformers' TemperatureLogitsWarper
    refuses it (greedy is `do_sample=False`); NaN is refused everywhere."""
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        for ok, name, want in self._checks():
            if not ok:
                value = getattr(self, name)
                fix = f"pass {name} as {want}"
                if name == "temperature" and _real(value) and value == 0:
                    fix = ("for greedy decoding pass do_sample=False (the default) and leave "
                           "temperature out; to sample, pass a temperature > 0")
                raise InputError(f"{name}={value!r} is not {want}", name, fix)

    def _checks(self) -> list[tuple[bool, str, str]]:
        t, k, p, seed = self.temperature, self.top_k, self.top_p, self.seed
        return [
            (_real(t) and 0 < t < math.inf, "temperature", "a finite number > 0"),
            (k is None or _integer(k) and k >= 1, "top_k", "None or an integer >= 1"),
            (p is None or _real(p) and 0 < p <= 1, "top_p", "None or a number in (0, 1]"),
            (seed is None or _integer(seed) and seed >= 0, "seed", "None or an integer >= 0"),
        ]

    @classmethod
    def for_request(cls, temperature: float = 1.0, top_k: int | None = None,
                    top_p: float | None = None, seed: int | None = None) -> SamplingParams:
        """An HTTP request's sampling: greedy where `is_greedy_temperature` says so, else
        sampled (top_p 1 and top_k None are no filter). Raises InputError on NaN, negative
        or infinite values, naming the field."""
        if not (_real(temperature) and temperature >= 0):
            raise InputError(f"temperature={temperature!r} is not a number >= 0",
                             "temperature", "pass a temperature >= 0 (0 is greedy)")
        if is_greedy_temperature(temperature):
            cls(top_k=top_k, top_p=top_p, seed=seed)  # validated all the same
            return cls(seed=seed)
        top_p = None if top_p is not None and _real(top_p) and top_p == 1 else top_p
        return cls(True, temperature, top_k, top_p, seed)

    def generator(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)


def _real(value: object) -> bool:
    """A real number that is not NaN (bools are not numbers here)."""
    return isinstance(value, (int, float, np.integer, np.floating)) \
        and not isinstance(value, (bool, np.bool_)) and not math.isnan(value)


def _integer(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def row_error(row: np.ndarray) -> str | None:
    """Why this logits row gives no token (NaN, +inf, or every token -inf), or None."""
    row = np.asarray(row)
    if np.isnan(row).any():
        return "contain NaN"
    if np.isposinf(row).any():
        return "contain +inf"
    if row.size and np.isneginf(row).all():
        return "are -inf for every token"
    return None


def bad_rows(logits: np.ndarray) -> np.ndarray:
    """Indices of the rows `row_error` refuses, in one pass: a row's max is NaN if it holds
    one, +inf if it holds one, -inf if every entry is."""
    return np.flatnonzero(~np.isfinite(np.max(logits, axis=1)))


def next_tokens(logits: np.ndarray, params: SamplingParams,
                rng: np.random.Generator | None = None) -> np.ndarray:
    """One token id per row of `logits` [batch, vocab] (int64); InputError naming the first
    row without a distribution (`row_error`)."""
    logits = _checked(logits)
    if not params.do_sample:
        return np.argmax(logits, axis=1).astype(np.int64)
    probs = _probabilities(logits, params)
    rng = rng if rng is not None else params.generator()
    draws = rng.random(len(probs))
    cumulative = np.cumsum(probs, axis=1)
    # the first token whose cumulative mass exceeds the draw: a token of probability 0 never
    # starts a step up, so it is never picked (not even for a draw of exactly 0)
    picks = (cumulative <= draws[:, None] * cumulative[:, -1:]).sum(axis=1)
    over = picks >= probs.shape[1]  # rounding put the draw at the total: the last possible
    if over.any():
        last = probs.shape[1] - 1 - np.argmax(probs[over, ::-1] > 0, axis=1)
        picks[over] = last
    return picks.astype(np.int64)


def probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The sampling distribution per row after temperature, top-k and top-p (float64)."""
    return _probabilities(_checked(logits), params)


def _checked(logits: np.ndarray) -> np.ndarray:
    logits = np.asarray(logits)
    if logits.ndim != 2 or logits.shape[1] == 0:
        raise InputError(f"logits of shape {list(logits.shape)}, not [batch, vocab]", "logits",
                         "pass the last position's logits of each sequence")
    bad = bad_rows(logits)
    if len(bad):
        raise InputError(f"the logits of sequence {int(bad[0])} {row_error(logits[bad[0]])}",
                         "logits", "the model produced non-finite logits (check its inputs "
                         "and weights: `dayzero align`)")
    return logits


def _probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64)
    vocab = x.shape[1]
    if params.top_k is not None and params.top_k < vocab:
        # the k-th largest logit: order by logits is the exact order by probability
        kth = np.partition(x, vocab - params.top_k, axis=1)[:, vocab - params.top_k, None]
        x = np.where(x < kth, -np.inf, x)
    weights = _scaled_exp(x, params.temperature)
    if params.top_p is not None and params.top_p < 1:
        weights = _top_p(x, weights, params.top_p)
    return weights / weights.sum(axis=1, keepdims=True)


def _scaled_exp(x: np.ndarray, temperature: float) -> np.ndarray:
    """exp((x - max) / T) per row, without overflow: the maxima are exactly 1, and a value
    that overflows to -inf is one whose exact weight rounds to 0 (T <= 1 only makes it more
    negative; above 1 the halves are subtracted, which cannot overflow)."""
    top = x.max(axis=1, keepdims=True)
    with np.errstate(over="ignore", under="ignore"):
        if temperature > 1:
            scaled = (x * 0.5 - top * 0.5) / (temperature * 0.5)
        else:
            scaled = (x - top) / temperature
        return np.exp(scaled)


def _top_p(x: np.ndarray, weights: np.ndarray, top_p: float) -> np.ndarray:
    """Zero the weights top-p drops. Ascending by logit (stable: among equal ones the lower
    index goes first), a token is dropped when its cumulative mass is <= 1 - p, that is when
    the mass strictly above it is >= p; the most likely token (nothing above it) stays."""
    order = np.argsort(x, axis=1, kind="stable")
    ordered = np.take_along_axis(weights, order, axis=1)
    probs = ordered / ordered.sum(axis=1, keepdims=True)
    above = np.zeros_like(probs)
    above[:, :-1] = np.cumsum(probs[:, :0:-1], axis=1)[:, ::-1]  # mass after each position
    drop = np.empty(probs.shape, bool)
    np.put_along_axis(drop, order, above >= top_p, axis=1)
    return np.where(drop, 0.0, weights)
