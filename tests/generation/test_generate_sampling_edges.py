"""`generate` on a real tiny Llama artifact at the edges of sampling (issue 33): a subnormal or
tiny temperature gives the greedy tokens (it returned token 0 everywhere), temperature 0 with
do_sample is refused as transformers refuses it, and non-finite logits for one prompt are an
error naming that prompt, with every block freed."""

from __future__ import annotations

import numpy as np
import pytest

import runtime
from compiler.errors import InputError
from tests.generation.tiny_lms import compile_lm, prompt, tiny_lm


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return runtime.load(compile_lm(tiny_lm("llama"), tmp_path_factory.mktemp("edges") / "lm.dz"))


PROMPTS = [prompt(5, seed=21).numpy()[0], prompt(9, seed=22).numpy()[0],
           prompt(3, seed=23).numpy()[0]]


@pytest.mark.parametrize("temperature", [1e-320, 5e-324, 1e-30])
def test_a_tiny_temperature_samples_the_greedy_tokens(lm, temperature):
    greedy = lm.generate(PROMPTS, max_new_tokens=6, eos_token_id=[])
    sampled = lm.generate(PROMPTS, max_new_tokens=6, eos_token_id=[], do_sample=True,
                          temperature=temperature, seed=3)
    np.testing.assert_array_equal(sampled, greedy)
    assert (greedy[:, -6:] != 0).any()


def test_temperature_zero_with_do_sample_is_refused(lm):
    with pytest.raises(InputError, match="temperature=0") as info:
        lm.generate(PROMPTS, max_new_tokens=2, do_sample=True, temperature=0.0)
    assert info.value.where == "temperature" and "do_sample=False" in info.value.fix
    assert lm.runner.allocator.used == 0


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_logits_of_one_prompt_are_an_error_naming_it(lm, monkeypatch, bad):
    run = lm.runner.run

    def poisoned(parts):
        logits, rows = run(parts)
        for row, i in enumerate(rows):  # prompt 1's third new token: the only part ending at 11
            if parts[i].start + len(parts[i].tokens) == 9 + 2:
                logits = logits.copy()
                logits[row, 17] = bad
        return logits, rows

    monkeypatch.setattr(lm.runner, "run", poisoned)
    with pytest.raises(InputError, match=r"input_ids\[1\]: the logits .* contain") as info:
        lm.generate(PROMPTS, max_new_tokens=4, eos_token_id=[])
    assert info.value.where == "input_ids[1]"
    assert lm.runner.allocator.used == 0
    streamed = []
    with pytest.raises(InputError, match=r"input_ids\[1\]"):
        for pair in lm.stream(PROMPTS, max_new_tokens=4, eos_token_id=[]):
            streamed.append(pair)
    assert [row for row, _ in streamed].count(1) == 2  # its tokens before the bad row
    assert lm.runner.allocator.used == 0
