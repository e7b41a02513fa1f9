"""runtime.sampling against transformers' logits warpers and torch.argmax."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from compiler.errors import InputError
from runtime.sampling import SamplingParams, next_tokens, probabilities


def _logits(batch=4, vocab=50, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, vocab)).astype(np.float32) * 3


def test_greedy_is_the_first_maximum_like_torch_argmax():
    logits = _logits()
    logits[1, [3, 7]] = 100.0  # a tie: the first index wins
    got = next_tokens(logits, SamplingParams())
    np.testing.assert_array_equal(got, torch.argmax(torch.from_numpy(logits), dim=1).numpy())
    assert got[1] == 3 and got.dtype == np.int64


@pytest.mark.parametrize("temperature, top_k, top_p", [
    (1.0, None, None), (0.7, None, None), (1.0, 5, None), (1.3, None, 0.9),
    (0.8, 10, 0.5), (1.0, 1, None), (1.0, None, 0.01), (2.0, 49, 0.999),
])
def test_filters_match_transformers(temperature, top_k, top_p):
    logits = _logits(seed=int(temperature * 10) + (top_k or 0))
    scores = torch.from_numpy(logits)
    for warper in ([TemperatureLogitsWarper(temperature)]
                   + ([TopKLogitsWarper(top_k)] if top_k else [])
                   + ([TopPLogitsWarper(top_p)] if top_p else [])):
        scores = warper(None, scores)
    want = torch.softmax(scores.double(), dim=-1).numpy()
    got = probabilities(logits, SamplingParams(True, temperature, top_k, top_p))
    np.testing.assert_array_equal(got > 0, want > 0)  # the same tokens survive
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)


def test_a_seed_reproduces_a_run_and_draws_follow_the_distribution():
    logits = np.log(np.array([[0.5, 0.2, 0.15, 0.1, 0.05]] * 20000))
    params = SamplingParams(do_sample=True, seed=7)
    first = next_tokens(logits, params)
    np.testing.assert_array_equal(first, next_tokens(logits, params))
    assert (first != next_tokens(logits, SamplingParams(do_sample=True, seed=8))).any()
    freq = np.bincount(first, minlength=5) / len(first)
    np.testing.assert_allclose(freq, [0.5, 0.2, 0.15, 0.1, 0.05], atol=0.01)
    top2 = next_tokens(logits, SamplingParams(do_sample=True, top_k=2, seed=1))
    assert set(top2.tolist()) == {0, 1}


def test_nan_logits_are_an_error_naming_the_sequence():
    logits = _logits()
    logits[2, 5] = np.nan
    with pytest.raises(InputError, match="sequence 2 contain NaN"):
        next_tokens(logits, SamplingParams())


@pytest.mark.parametrize("field, value", [("temperature", 0), ("temperature", float("inf")),
                                          ("top_k", 0), ("top_k", 2.5), ("top_p", 0),
                                          ("top_p", 1.5), ("seed", -1), ("seed", True)])
def test_bad_parameters_name_the_field(field, value):
    with pytest.raises(InputError, match=f"{field}="):
        SamplingParams(do_sample=True, **{field: value})
