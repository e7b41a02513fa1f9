"""The OpenAI / vLLM call arguments of runtime/logit_processors.py: `logit_bias`, and the
frequency and presence penalties, against a float64 reference of their formulas, in vLLM's
order around transformers' repetition penalty, with per-sequence counts kept incrementally."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.errors import InputError
from runtime.logit_processors import LogitProcessors

VOCAB = 16


def _reference(logits, tokens, prompt_len, bias, repetition, frequency, presence):
    x = logits.astype(np.float64).copy()
    for token, value in bias.items():
        x[token] += value  # vLLM: the bias on the raw logits first
    for token in set(tokens):
        x[token] = x[token] / repetition if x[token] > 0 else x[token] * repetition
    generated = tokens[prompt_len:]
    for token in set(generated):
        x[token] -= frequency * generated.count(token) + presence
    return x


def test_bias_and_penalties_follow_their_formulas_step_by_step():
    rng = np.random.default_rng(0)
    bias = {3: 2.5, 7: -1.0}
    processors = LogitProcessors({}, VOCAB, (2,)).for_call(
        {"logit_bias": {str(t): b for t, b in bias.items()}, "repetition_penalty": 1.3,
         "frequency_penalty": 0.7, "presence_penalty": 0.4})
    assert processors.names == ("logit_bias", "repetition_penalty", "frequency_penalty")
    tokens = [1, 5, 5]
    history = processors.history(tokens, 3, 20)
    for _ in range(8):
        logits = rng.standard_normal((1, VOCAB)).astype(np.float32)
        got = processors.apply(logits, [history])[0]
        want = _reference(logits[0], tokens, 3, bias, 1.3, 0.7, 0.4)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        tokens.append(int(rng.choice([1, 3, 5, 9])))  # the History holds the caller's list


def test_counts_look_only_at_new_tokens():
    processors = LogitProcessors({}, VOCAB).for_call({"presence_penalty": 1.0})
    tokens = [1, 2, 3]
    history = processors.history(tokens, 3, 50)
    processors.apply(np.zeros((1, VOCAB), np.float32), [history])
    table = next(iter(history.tables.values()))
    assert table.size == 0  # the prompt is not counted
    tokens += [4, 4, 5]
    processors.apply(np.zeros((1, VOCAB), np.float32), [history])
    assert table.done == 6 and table.size == 2
    tokens.append(4)
    scores = processors.apply(np.zeros((1, VOCAB), np.float32), [history])[0]
    assert table.done == 7 and scores[4] == -1.0 and scores[5] == -1.0 and scores[1] == 0.0


@pytest.mark.parametrize("overrides, field", [
    ({"logit_bias": {"16": 1}}, "logit_bias"), ({"logit_bias": {"1": 200}}, "logit_bias"),
    ({"logit_bias": {"1": float("nan")}}, "logit_bias"),
    ({"frequency_penalty": 2.1}, "frequency_penalty"),
    ({"presence_penalty": float("nan")}, "presence_penalty")])
def test_a_bad_value_names_its_argument(overrides, field):
    with pytest.raises(InputError) as caught:
        LogitProcessors({}, VOCAB).for_call(overrides)
    assert caught.value.where == field
