"""`generate` and `stream` as a user calls them: sampling, streaming, the paged cache under
pressure (preemption loses nothing), and one clear message for every bad request."""

from __future__ import annotations

import numpy as np
import pytest

import compiler
import runtime
from compiler.errors import InputError
from tests.generation.tiny_lms import compile_lm, prompt, tiny_lm

BLOCK_BYTES = 2 * 2 * 16 * 2 * 16 * 4  # layers x (k, v) x block 16 x kv heads 2 x head 16 x f32


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return compile_lm(tiny_lm("llama"), tmp_path_factory.mktemp("api") / "lm.dz")


@pytest.fixture(scope="module")
def lm(artifact):
    return runtime.load(artifact)


def test_seeded_sampling_reproduces_and_the_seed_matters(lm):
    ids = prompt(6, seed=1).numpy()
    kwargs = dict(max_new_tokens=32, do_sample=True, temperature=0.9, top_k=50, top_p=0.95,
                  eos_token_id=[])
    first = lm.generate(ids, seed=7, **kwargs)
    assert np.array_equal(first, lm.generate(ids, seed=7, **kwargs))
    assert not np.array_equal(first, lm.generate(ids, seed=8, **kwargs))
    greedy = lm.generate(ids, max_new_tokens=32, eos_token_id=[])
    assert not np.array_equal(first, greedy)  # 32 sampled tokens of 256 are not all the argmax


def test_stream_yields_the_tokens_generate_returns(lm):
    ids = prompt(5, seed=2).numpy()
    whole = lm.generate(ids, max_new_tokens=20, eos_token_id=[])
    assert list(lm.stream(ids, max_new_tokens=20, eos_token_id=[])) == whole[0, 5:].tolist()
    pairs = list(lm.stream([ids[0], ids[0, :3]], max_new_tokens=4, eos_token_id=[]))
    assert sorted(row for row, _ in pairs) == [0] * 4 + [1] * 4
    assert lm.runner.allocator.used == 0  # every finished sequence gave its blocks back


def test_eos_stops_a_row_and_pads_it(lm):
    ids = prompt(5, seed=2).numpy()
    free = lm.generate(ids, max_new_tokens=20, eos_token_id=[])
    stop = int(free[0, 5 + 3])  # the fourth new token ends the sequence
    got = lm.generate(ids, max_new_tokens=20, eos_token_id=stop, pad_token_id=0)
    first = int(np.flatnonzero(free[0, 5:] == stop)[0])
    assert got.shape == (1, 5 + first + 1)
    assert got[0, -1] == stop and np.array_equal(got[0], free[0, :5 + first + 1])


def test_left_padded_batch_with_an_attention_mask(lm):
    a, b = prompt(9, seed=3).numpy()[0], prompt(4, seed=4).numpy()[0]
    ids = np.zeros((2, 9), np.int64)
    mask = np.zeros((2, 9), np.int64)
    ids[0], mask[0] = a, 1
    ids[1, 5:], mask[1, 5:] = b, 1
    got = lm.generate(ids, attention_mask=mask, max_new_tokens=8, eos_token_id=[])
    assert np.array_equal(got[:, :9], ids)
    assert np.array_equal(got[1, 9:], lm.generate(b, max_new_tokens=8, eos_token_id=[])[0, 4:])


def test_a_full_cache_preempts_the_newest_and_loses_nothing(artifact, lm):
    prompts = [prompt(20, seed=10 + i).numpy()[0] for i in range(3)]
    roomy = lm.generate(prompts, max_new_tokens=24, eos_token_id=[])
    # 44 tokens a sequence need 3 blocks: 6 blocks hold two of the three at a time
    tight = runtime.load(artifact, kv_cache_memory=6 * BLOCK_BYTES)
    assert tight.runner.allocator.num_blocks == 6
    got = tight.generate(prompts, max_new_tokens=24, eos_token_id=[])
    assert np.array_equal(got, roomy)
    assert tight.stats.preemptions > 0 and tight.runner.allocator.used == 0


@pytest.mark.parametrize("call, where, words", [
    (lambda m: m.generate(np.ones((1, 250), np.int64), max_new_tokens=10), "input_ids",
     "exceeds the 256 positions"),
    (lambda m: m.generate(np.array([[1, 300]]), max_new_tokens=2), "input_ids[0]",
     "outside the vocabulary"),
    (lambda m: m.generate(np.array([[1, -1]]), max_new_tokens=2), "input_ids[0]",
     "outside the vocabulary"),
    (lambda m: m.generate(np.array([[1, 2]]), max_new_tokens=0), "max_new_tokens",
     "not a positive integer"),
    (lambda m: m.generate(np.array([[1.5, 2]]), max_new_tokens=2), "input_ids", "integer"),
    (lambda m: m.generate([], max_new_tokens=2), "input_ids", "integer token ids"),
    (lambda m: m.generate(np.ones((2, 3), np.int64), attention_mask=np.array([[1, 0, 1]] * 2),
                          max_new_tokens=2), "attention_mask", "holes"),
    (lambda m: m.generate(np.array([[1, 2]]), max_new_tokens=2, temperature=0), "temperature",
     "temperature"),
])
def test_bad_requests_get_one_clear_message(lm, call, where, words):
    with pytest.raises(InputError, match=words) as info:
        call(lm)
    assert where in info.value.where
    assert lm.runner.allocator.used == 0


def test_a_cache_too_small_for_one_sequence_is_refused_before_any_work(artifact):
    small = runtime.load(artifact, kv_cache_memory=2 * BLOCK_BYTES)
    with pytest.raises(InputError, match="less than one sequence") as info:
        small.generate(prompt(30, seed=1).numpy(), max_new_tokens=8)
    assert info.value.where == "generation.kv_cache_memory"


def test_a_forward_artifact_says_how_to_compile_for_generation(tmp_path):
    import torch

    from tests.generation.tiny_lms import CausalLM

    path = compiler.compile(CausalLM(tiny_lm("gpt2")), (prompt(8, seed=1),), tmp_path / "f.dz",
                            dynamic_shapes=({1: torch.export.Dim("seq", min=2, max=64)},))
    model = runtime.load(path)
    with pytest.raises(InputError, match="task forward") as info:
        model.generate(prompt(3, seed=1).numpy())
    assert "--task text-generation" in info.value.fix


def test_inspect_memory_shows_weights_kv_cache_and_activations_apart(artifact, lm, capsys):
    from compiler.cli import main

    assert main(["inspect", str(artifact), "--memory"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()[1:5]}
    assert set(lines) == {"weights", "KV", "activations", "total"}
    kv_mib = float(lines["KV"].split()[2])
    assert kv_mib == pytest.approx(lm.runner.cache_bytes / 2**20, abs=0.01)
    assert "one step of 256 tokens" in lines["activations"]  # the exported range caps the budget


def test_align_checks_a_prefill_and_a_decode_step(artifact, capsys):
    from compiler.cli import main

    assert main(["align", str(artifact)]) == 0
    out = capsys.readouterr().out
    assert "== prefill step (8 tokens, empty cache)" in out
    assert "== decode step (1 token after 8 cached)" in out
    assert out.count("OK: every compared value is within its threshold") == 2


def test_run_and_bench_treat_it_as_the_prefill_forward(artifact, capsys):
    from compiler.cli import main

    assert main(["run", str(artifact), "--size", "seq=20"]) == 0
    out = capsys.readouterr().out
    assert "input_ids[1, 20]" in out and "float32[1, 20, 256]" in out
    assert main(["bench", str(artifact), "--size", "seq=20", "--runs", "3",
                 "--warmup", "1"]) == 0
    assert "input_ids[1, 20]" in capsys.readouterr().out
