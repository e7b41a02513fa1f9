"""Greedy generation token for token as transformers' `generate`, on each architecture.

For every model the generation issue names, a generation artifact compiled from its
`input_ids -> logits` forward (no per-model code) is checked three ways against transformers'
own KV-cached generation of the same random-weight model: the logits of the prompt and of every
decode step, teacher-forced with transformers' tokens, agree within 1e-4; greedy tokens agree
one for one, except after a step where transformers' own top-2 logits lie within 1e-4 (a tie
any reordering may flip); and a batch of prompts of different lengths gives each prompt the
tokens it gets alone.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import runtime
from runtime.generation.step import StepPart
from tests.generation.tiny_lms import compile_lm, prompt, tiny_lm

NEW = 64
ARCHITECTURES = ["llama", "gpt2", "qwen3", "mistral", "gemma2", "phi3"]


@pytest.fixture(scope="module", params=ARCHITECTURES)
def lm(request, tmp_path_factory):
    hf = tiny_lm(request.param)
    hf.generation_config.eos_token_id = None  # 64 tokens every time, on both sides
    path = compile_lm(hf, tmp_path_factory.mktemp(request.param) / "lm.dz")
    return hf, runtime.load(path)


def transformers_generate(hf, ids: torch.Tensor, new: int = NEW):
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                          do_sample=False, output_logits=True, return_dict_in_generate=True,
                          pad_token_id=0)
    return out.sequences[0].numpy(), [x[0].numpy() for x in out.logits]


def teacher_forced_logits(model, tokens: np.ndarray, prompt_len: int) -> list[np.ndarray]:
    """The artifact's logits after the prompt and after each of `tokens`' later tokens, fed
    one decode step at a time."""
    runner = model.runner
    runner.allocator.grow("forced", len(tokens))
    table = runner.allocator.tables["forced"]
    try:
        rows = [runner.run([StepPart(tokens[:prompt_len], 0, table)])[0][0]]
        for i in range(prompt_len, len(tokens) - 1):
            rows.append(runner.run([StepPart(tokens[i:i + 1], i, table)])[0][0])
    finally:
        runner.allocator.release("forced")
    return rows


def assert_same_greedy(got: np.ndarray, want: np.ndarray, logits: list[np.ndarray],
                       prompt_len: int) -> None:
    """Equal tokens up to the first difference, which must follow a top-2 tie in `logits`."""
    differ = np.flatnonzero(got != want)
    if len(differ):
        step = int(differ[0]) - prompt_len
        top2 = np.sort(logits[step])[-2:]
        assert top2[1] - top2[0] < 1e-4, (
            f"token {step} differs ({got[differ[0]]} vs {want[differ[0]]}) although "
            f"transformers' top-2 margin is {top2[1] - top2[0]}")


@pytest.mark.parametrize("length", [1, 7, 100])
def test_greedy_tokens_and_step_logits_match_transformers(lm, length):
    hf, model = lm
    ids = prompt(length, seed=length)
    want, want_logits = transformers_generate(hf, ids)
    forced = teacher_forced_logits(model, want, length)
    assert len(forced) == NEW
    for step, (a, b) in enumerate(zip(forced, want_logits)):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=0, err_msg=f"decode step {step}")
    got = model.generate(ids.numpy(), max_new_tokens=NEW, eos_token_id=[])
    assert got.shape == (1, length + NEW)
    assert_same_greedy(got[0], want, want_logits, length)


def test_a_batch_gives_each_prompt_its_own_tokens(lm):
    hf, model = lm
    prompts = [prompt(n, seed=n)[0].numpy() for n in (5, 17, 40)]
    batch = model.generate(prompts, max_new_tokens=24, eos_token_id=[])
    assert batch.shape == (3, 40 + 24)
    for row, ids in enumerate(prompts):
        alone = model.generate(ids, max_new_tokens=24, eos_token_id=[])[0]
        # left-padded to the longest prompt, as a tokenizer pads for generation
        np.testing.assert_array_equal(batch[row, 40 - len(ids):], alone)
        want, logits = transformers_generate(hf, torch.as_tensor(ids)[None], 24)
        assert_same_greedy(alone, want, logits, len(ids))


def test_the_artifact_is_still_its_prefill_forward(lm):
    hf, model = lm
    ids = prompt(9, seed=3)
    with torch.no_grad():
        eager = hf(ids, use_cache=False).logits.numpy()
    (logits,) = model(ids.numpy())
    assert logits.shape == eager.shape
    np.testing.assert_allclose(logits, eager, atol=1e-4, rtol=0)
