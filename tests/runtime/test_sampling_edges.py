"""runtime.sampling at the edges of its range (issue 33): tiny, huge and unit temperatures,
top-k 1 / vocab / beyond, top-p tiny and 1, against a float64 reference written here in
mpmath (60 digits, transformers' warper semantics: temperature, then top-k, then top-p): the
probabilities within 1e-6 (in fact 1e-9 relative) and the same support. NaN parameters and
non-finite rows are refused; a -inf logit alone is a mask."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from compiler.errors import InputError
from runtime.sampling import (
    SamplingParams,
    bad_rows,
    is_greedy_temperature,
    next_tokens,
    probabilities,
    row_error,
)

SUBNORMAL_EDGE = (2.0 ** -1076, 2.0 ** -1072)  # exact values here may round either way


def reference(row, temperature, top_k=None, top_p=None) -> tuple[list, list]:
    """The exact distribution (mpf) of one logits row, and each kept token's cumulative mass
    in top-p's ascending order (to tell a knife-edge case). -inf is a masked token."""
    mpmath.mp.dps = 60
    vocab = len(row)
    keep = [not math.isinf(v) for v in row]
    if top_k is not None and top_k < vocab:
        kth = sorted(row, reverse=True)[top_k - 1]
        keep = [k and v >= kth for k, v in zip(keep, row)]
    top = max(v for v, k in zip(row, keep) if k)
    weights = []
    for v, k in zip(row, keep):
        scaled = (mpmath.mpf(v) - mpmath.mpf(top)) / mpmath.mpf(temperature) if k else None
        # below -800 the weight is < e^-800 over a total >= 1 (the maximum weighs 1): it
        # rounds to 0 in float64
        weights.append(mpmath.mpf(0) if scaled is None or scaled < -800 else mpmath.exp(scaled))
    probs = [w / sum(weights) for w in weights]
    cumulative = []
    if top_p is not None and top_p < 1:
        order = sorted(range(vocab), key=lambda i: (row[i], i))  # ascending, stable
        running = mpmath.mpf(0)
        for position, i in enumerate(order):
            running += probs[i]
            cumulative.append(running)
            if running <= 1 - mpmath.mpf(top_p) and position < vocab - 1:
                weights[i] = mpmath.mpf(0)
        probs = [w / sum(weights) for w in weights]
    return probs, cumulative


def assert_matches_reference(row, temperature, top_k=None, top_p=None) -> np.ndarray:
    got = probabilities(np.asarray([row]), SamplingParams(True, temperature, top_k, top_p))[0]
    exact, _ = reference(row, temperature, top_k, top_p)
    want = np.array([float(p) for p in exact])
    assert np.all(np.abs(got - want) <= 1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-300)
    clear = np.array([not SUBNORMAL_EDGE[0] < p < SUBNORMAL_EDGE[1] for p in exact])
    np.testing.assert_array_equal((got > 0)[clear], (want > 0)[clear])  # the same support
    return got


ROW = [0.5, 3.25, -1.0, 3.0, -np.inf, 2.0, 3.25 - 2 ** -20, -7.5]  # float32-exact values


@pytest.mark.parametrize("temperature", [5e-324, 1e-320, 1e-300, 1e-30])
def test_a_tiny_temperature_is_the_argmax_one_hot(temperature):
    got = assert_matches_reference(ROW, temperature)
    np.testing.assert_array_equal(got, np.eye(len(ROW))[1])
    # tied maxima share the mass equally: the limit, not token 0
    tied = assert_matches_reference([1.0, 4.0, 4.0, -np.inf], temperature)
    np.testing.assert_array_equal(tied, [0, 0.5, 0.5, 0])


@pytest.mark.parametrize("temperature", [1e30, 1e300, 1.7976931348623157e308])
def test_a_huge_temperature_is_uniform_over_the_unmasked_tokens(temperature):
    got = assert_matches_reference(ROW, temperature)
    unmasked = np.isfinite(ROW)
    np.testing.assert_allclose(got[unmasked], 1 / unmasked.sum(), rtol=1e-12)
    assert got[4] == 0  # -inf stays masked at any temperature


def test_huge_logits_do_not_overflow_their_difference():
    # (x - max) overflows float64 here; the exact scaled scores are -3 and 0
    got = assert_matches_reference([-1.5e308, 1.5e308], 1e308)
    np.testing.assert_allclose(got, [1 / (1 + math.e ** 3), 1 / (1 + math.e ** -3)], rtol=1e-12)


@pytest.mark.parametrize("top_k, top_p", [(None, None), (1, None), (8, None), (9, None),
                                          (1000, None), (None, 1.0), (None, 1e-300),
                                          (None, 1e-9), (3, 0.5), (None, 0.999999)])
@pytest.mark.parametrize("temperature", [1e-320, 1e-30, 0.25, 1.0, 3.0, 1e300])
def test_the_filters_at_their_edges_match_the_reference(temperature, top_k, top_p):
    assert_matches_reference(ROW, temperature, top_k, top_p)


def test_top_k_1_keeps_ties_and_tiny_top_p_keeps_only_the_most_likely():
    row = [1.0, 4.0, 4.0, 2.0]
    np.testing.assert_array_equal(assert_matches_reference(row, 1.0, top_k=1), [0, .5, .5, 0])
    got = assert_matches_reference(ROW, 1.0, top_p=1e-300)
    np.testing.assert_array_equal(got, np.eye(len(ROW))[1])


logit = st.one_of(st.floats(-60, 60, width=32), st.just(-math.inf), st.sampled_from([0.0, 2.5]))
temperatures = st.one_of(st.sampled_from([5e-324, 1e-320, 1e-300, 1e-30, 1.0, 1e30, 1e300]),
                         st.floats(min_value=5e-324, max_value=1e308))


@settings(max_examples=400, deadline=None, derandomize=True)
@given(row=st.lists(logit, min_size=1, max_size=24), temperature=temperatures,
       top_k=st.one_of(st.none(), st.integers(1, 30)),
       top_p=st.one_of(st.none(), st.floats(1e-12, 1.0, exclude_min=True)))
def test_random_rows_match_the_reference(row, temperature, top_k, top_p):
    assume(any(math.isfinite(v) for v in row))
    _, cumulative = reference(row, temperature, top_k, top_p)
    if top_p is not None:  # not a knife edge between float64 and exact rounding
        assume(all(abs(c - (1 - mpmath.mpf(top_p))) > 1e-12 for c in cumulative))
    assert_matches_reference(row, temperature, top_k, top_p)


@pytest.mark.parametrize("temperature", [5e-324, 1e-320, 1e-30])
def test_sampling_at_a_tiny_temperature_gives_the_greedy_token(temperature):
    logits = np.random.default_rng(3).standard_normal((64, 50)).astype(np.float32)
    greedy = next_tokens(logits, SamplingParams())
    sampled = next_tokens(logits, SamplingParams(True, temperature, seed=5))
    np.testing.assert_array_equal(sampled, greedy)
    assert (greedy != 0).any()  # the bug this guards against returned token 0 everywhere


class _Fixed:
    """A generator whose draws are all `value`."""

    def __init__(self, value: float):
        self.value = value

    def random(self, n: int) -> np.ndarray:
        return np.full(n, self.value)


@pytest.mark.parametrize("draw", [0.0, 0.5, 1 - 2 ** -53])
def test_a_token_of_probability_zero_is_never_drawn(draw):
    logits = np.array([[-np.inf, 0.0, 5.0, -np.inf], [1.0, 9.0, -np.inf, -np.inf]])
    got = next_tokens(logits, SamplingParams(True, 1e-30), _Fixed(draw))
    np.testing.assert_array_equal(got, [2, 1])


def test_draws_stay_on_the_support_at_a_huge_temperature():
    logits = np.array([[0.0, -np.inf, 1.0, -np.inf, 2.0]] * 3000)
    got = next_tokens(logits, SamplingParams(True, 1e300, seed=1))
    assert set(got.tolist()) == {0, 2, 4}
    np.testing.assert_allclose(np.bincount(got, minlength=5)[[0, 2, 4]] / 3000, 1 / 3,
                               atol=0.04)


@pytest.mark.parametrize("bad, words", [(np.nan, "contain NaN"), (np.inf, r"contain \+inf")])
def test_a_row_with_nan_or_plus_inf_has_no_token(bad, words):
    logits = np.zeros((3, 6))
    logits[1, 4] = bad
    assert bad_rows(logits).tolist() == [1]
    for params in (SamplingParams(), SamplingParams(True, 0.7, seed=1)):
        with pytest.raises(InputError, match=f"sequence 1 {words}"):
            next_tokens(logits, params)


def test_a_row_all_minus_inf_has_no_token_but_minus_inf_alone_is_a_mask():
    logits = np.array([[-np.inf, 0.5, -np.inf], [-np.inf] * 3])
    assert row_error(logits[1]) == "are -inf for every token"
    with pytest.raises(InputError, match="sequence 1 are -inf for every token"):
        next_tokens(logits, SamplingParams())
    assert row_error(logits[0]) is None
    assert next_tokens(logits[:1], SamplingParams(True, 50.0, seed=2)).tolist() == [1]


@pytest.mark.parametrize("field, value", [("temperature", math.nan), ("top_p", math.nan),
                                          ("top_k", math.nan), ("temperature", math.inf),
                                          ("temperature", -1.0), ("top_k", 0),
                                          ("top_p", 0.0), ("top_p", 1.0 + 1e-12)])
def test_nan_and_out_of_range_parameters_are_refused(field, value):
    with pytest.raises(InputError, match=f"{field}=") as info:
        SamplingParams(do_sample=True, **{field: value})
    assert info.value.where == field


def test_temperature_zero_with_do_sample_is_refused_as_transformers_refuses_it():
    with pytest.raises(InputError, match="temperature=0") as info:
        SamplingParams(do_sample=True, temperature=0.0)
    assert "do_sample=False" in info.value.fix


@pytest.mark.parametrize("temperature, greedy", [
    (0, True), (0.0, True), (5e-324, True), (1e-320, True), (2.225e-308, True),
    (2.2250738585072014e-308, False), (1e-300, False), (0.7, False), (2.0, False),
    (math.nan, False), (-1e-320, False)])
def test_is_greedy_temperature_is_zero_or_subnormal(temperature, greedy):
    assert is_greedy_temperature(temperature) is greedy


def test_for_request_maps_an_http_request_to_sampling():
    assert SamplingParams.for_request(1e-320, top_p=0.5, seed=3) == SamplingParams(seed=3)
    assert SamplingParams.for_request(0) == SamplingParams()
    assert SamplingParams.for_request(0.7, top_p=1.0, seed=4) == SamplingParams(
        True, 0.7, None, None, 4)
    assert SamplingParams.for_request(1.3, top_k=5, top_p=0.9).top_p == 0.9
    for kwargs, field in [({"temperature": math.nan}, "temperature"),
                          ({"temperature": -0.5}, "temperature"),
                          ({"temperature": math.inf}, "temperature"),
                          ({"temperature": 0, "top_p": math.nan}, "top_p"),
                          ({"temperature": 0.5, "top_p": math.nan}, "top_p")]:
        with pytest.raises(InputError) as info:
            SamplingParams.for_request(**kwargs)
        assert info.value.where == field
