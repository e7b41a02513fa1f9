"""runtime/logit_processors.py against transformers' own processors, as `generate` builds them
from a GenerationConfig (`_get_logits_processor`: which ones, in which order): random float32
logits over a small vocabulary (so tokens repeat and n-grams recur), three sequences with
prompts of 1, 4 and 9 tokens, seven steps with a token appended each step. The processed
scores must equal transformers' bit for bit (-inf where transformers has -inf). Then the
checks of every field, the incremental tables (one table per sequence, a step touching only
the new token) and the Scheduler applying them."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from compiler.errors import ArtifactError, InputError
from runtime import logit_processor_ops, logit_processors
from runtime.generation.scheduler import Scheduler, Sequence
from runtime.logit_processors import LogitProcessors
from runtime.sampling import SamplingParams
from tests.generation.test_scheduler_edges import GREEDY, FakeRunner

VOCAB = 32
EOS = (2, 3)  # several EOS ids
MAX_NEW = 5
PROMPTS = (1, 4, 9)

CONFIGS = {
    "repetition_penalty": {"repetition_penalty": 1.3},
    "repetition_reward": {"repetition_penalty": 0.7},
    "no_repeat_unigram": {"no_repeat_ngram_size": 1},
    "no_repeat_bigram": {"no_repeat_ngram_size": 2},
    "no_repeat_trigram": {"no_repeat_ngram_size": 3},
    # [2] is an EOS id: transformers drops it from the bad words
    "bad_words_ids": {"bad_words_ids": [[5], [7, 9], [2], [10, 11, 12], [7, 13]]},
    "sequence_bias": {"sequence_bias": [[[20], 1.5], [[7, 20], -2.25], [[7, 21], 0.5],
                                        [[1, 7, 20], 0.125], [[22], -math.inf]]},
    "min_length": {"min_length": 7},
    "min_new_tokens": {"min_new_tokens": 3},
    "forced_bos_token_id": {"forced_bos_token_id": 4},
    "forced_eos_token_id": {"forced_eos_token_id": 2},
    "forced_eos_token_ids": {"forced_eos_token_id": [2, 3]},
    "suppress_tokens": {"suppress_tokens": [11, 12, 0]},
    "begin_suppress_tokens": {"begin_suppress_tokens": [13, 1]},
    "begin_after_forced_bos": {"begin_suppress_tokens": [13], "forced_bos_token_id": 4},
    "all": {"repetition_penalty": 1.3, "no_repeat_ngram_size": 2, "bad_words_ids": [[5], [7, 9]],
            "sequence_bias": [[[20], 1.5]], "min_length": 6, "min_new_tokens": 3,
            "forced_bos_token_id": 4, "forced_eos_token_id": 2, "suppress_tokens": [11, 12],
            "begin_suppress_tokens": [13]},
}


@pytest.fixture(scope="module")
def hf():
    from tests.generation.tiny_lms import tiny_lm

    return tiny_lm("llama")


def transformers_scores(hf, config: dict, tokens: list[int], prompt_len: int,
                        scores: np.ndarray, eos=EOS) -> np.ndarray:
    """transformers' processors for one sequence, built by its `generate` from `config`."""
    from transformers import GenerationConfig

    gc = GenerationConfig(**config, eos_token_id=list(eos), max_length=prompt_len + MAX_NEW)
    hf._prepare_special_tokens(gc, True, device="cpu")
    ids = torch.tensor([tokens])
    processors = hf._get_logits_processor(gc, input_ids_seq_length=prompt_len,
                                          encoder_input_ids=ids, device="cpu",
                                          model_kwargs={"attention_mask": torch.ones_like(ids)})
    return processors(ids, torch.from_numpy(scores[None].copy()))[0].numpy()


def _step_tokens(rng: np.random.Generator, scores: np.ndarray) -> list[int]:
    """The next tokens: the processed argmax, or a token from a few that make repeats."""
    return [int(np.argmax(row)) if rng.random() < 0.4 else int(rng.choice([1, 7, 9, 10, 11, 20]))
            for row in scores]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_scores_are_transformers_bit_for_bit(hf, name):
    config = CONFIGS[name]
    ours = LogitProcessors.from_config(config, VOCAB, EOS)
    assert ours.active
    rng = np.random.default_rng(sorted(CONFIGS).index(name))
    histories = [ours.history(rng.choice([1, 7, 9, 10, 11, 20, 21], n).tolist(), n, MAX_NEW)
                 for n in PROMPTS]
    changed = 0
    for _ in range(MAX_NEW + 2):
        logits = (rng.standard_normal((len(PROMPTS), VOCAB)) * 3).astype(np.float32)
        got = ours.apply(logits, histories)
        assert got.dtype == np.float32
        for row, h in enumerate(histories):
            want = transformers_scores(hf, config, h.tokens, h.prompt_len, logits[row])
            np.testing.assert_array_equal(got[row], want, err_msg=f"{name}: {h}")
        changed += int((got != logits).sum())
        for h, token in zip(histories, _step_tokens(rng, got)):
            h.tokens.append(token)
    assert changed  # the processor acted


def test_a_row_without_a_distribution_stays_as_the_model_gave_it():
    # forced EOS would turn a NaN row into a clean one-hot: the model's NaN must stay an error
    ours = LogitProcessors.from_config({"forced_eos_token_id": 2}, VOCAB, EOS)
    logits = np.zeros((3, VOCAB), np.float32)
    logits[0, 5], logits[1, 6], logits[2] = np.nan, np.inf, -np.inf
    histories = [ours.history([4, 5], 2, 1) for _ in range(3)]
    got = ours.apply(logits, histories)
    np.testing.assert_array_equal(got, logits)
    fine = ours.apply(np.zeros((1, VOCAB), np.float32), histories[:1])
    assert fine[0, 2] == 0 and np.isneginf(np.delete(fine[0], 2)).all()


def test_a_step_folds_in_only_the_new_token(monkeypatch):
    """The n-gram and seen-id tables are built once per sequence and extended by each new
    token: a step costs O(1) table lookups, not O(length)."""
    ours = LogitProcessors.from_config({"no_repeat_ngram_size": 3, "repetition_penalty": 1.2},
                                       VOCAB, EOS)
    history = ours.history(list(range(3, 30)) * 20, 540, 200)
    ours.apply(np.zeros((1, VOCAB), np.float32), [history])
    tables = dict(history.tables)
    calls = []
    real = logit_processor_ops._NGrams._entry
    monkeypatch.setattr(logit_processor_ops._NGrams, "_entry",
                        lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    for token in (5, 6, 7):
        history.tokens.append(token)
        ours.apply(np.zeros((1, VOCAB), np.float32), [history])
    assert len(calls) == 6  # per step: the new n-gram, and the lookup of the banned ones
    assert history.tables == tables  # the same tables, extended
    seen = next(t for t in tables.values() if isinstance(t, logit_processor_ops._Seen))
    assert seen.done == len(history.tokens) and seen.count == 27


def test_ngram_prefixes_that_share_a_hash_are_told_apart(hf, monkeypatch):
    """The n-gram table keys a prefix by its hash and compares it: every prefix colliding
    (one hash for all) must still ban exactly transformers' tokens."""
    monkeypatch.setattr(logit_processor_ops, "hash", lambda _: 0, raising=False)
    config = {"no_repeat_ngram_size": 3}
    ours = LogitProcessors.from_config(config, VOCAB, EOS)
    rng = np.random.default_rng(3)
    tokens = rng.choice([1, 7, 9], 40).tolist()
    history = ours.history(tokens, 40, 10)
    for _ in range(5):
        logits = rng.standard_normal((1, VOCAB)).astype(np.float32)
        got = ours.apply(logits, [history])
        np.testing.assert_array_equal(got[0], transformers_scores(hf, config, history.tokens,
                                                                  40, logits[0]))
        assert np.isneginf(got).any()
        history.tokens.append(int(rng.choice([1, 7, 9])))


BAD = [
    ("repetition_penalty", 0), ("repetition_penalty", -1.5), ("repetition_penalty", "1.2"),
    ("repetition_penalty", True), ("repetition_penalty", math.nan),
    ("repetition_penalty", math.inf), ("no_repeat_ngram_size", -1),
    ("no_repeat_ngram_size", 2.0), ("min_new_tokens", -3), ("min_length", 1 << 40),
    ("bad_words_ids", [[]]), ("bad_words_ids", [5]), ("bad_words_ids", [[VOCAB]]),
    ("bad_words_ids", "5"), ("suppress_tokens", [-1]), ("suppress_tokens", 5),
    ("begin_suppress_tokens", [VOCAB]), ("forced_eos_token_id", VOCAB),
    ("forced_eos_token_id", [1.0]), ("forced_bos_token_id", [1]),
    ("sequence_bias", [[[1], "x"]]), ("sequence_bias", [[[1], math.inf]]),
    ("sequence_bias", [[1, 2]]),
]


@pytest.mark.parametrize("key, value", BAD)
def test_a_bad_value_is_refused_naming_its_field(key, value):
    with pytest.raises(InputError) as info:
        LogitProcessors.from_config({key: value}, VOCAB, EOS)
    assert info.value.where == key and f"pass {key} as" in info.value.fix
    default = LogitProcessors.from_config({}, VOCAB, EOS)
    with pytest.raises(InputError) as info:
        default.for_call({key: value})
    assert info.value.where == key
    with pytest.raises(ArtifactError) as info:
        LogitProcessors.from_config({key: value}, VOCAB, source="lm.dz/generation_config.json",
                                    error=ArtifactError)
    assert info.value.where == f"lm.dz/generation_config.json: {key}"
    assert "generation_config.json" in info.value.fix


def test_the_bounds_keep_the_work_bounded():
    with pytest.raises(InputError, match="at most"):
        LogitProcessors.from_config({"bad_words_ids": [[1]] * (logit_processors.MAX_IDS + 1)},
                                    VOCAB)


def test_a_call_overrides_the_config_and_can_turn_processors_off():
    config = LogitProcessors.from_config({"repetition_penalty": 1.3, "suppress_tokens": [4],
                                          "eos_token_id": 2, "num_beams": 1}, VOCAB, EOS)
    assert config.names == ("repetition_penalty", "suppress_tokens")
    assert config.eos_token_ids == (2,)  # the config's own EOS id over the one given
    assert config.for_call({}, [2]) is config and config.for_call({"min_length": None}) is config
    assert config.for_call({}, EOS).eos_token_ids == EOS
    call = config.for_call({"repetition_penalty": 1.0, "no_repeat_ngram_size": 2})
    assert call.names == ("no_repeat_ngram_size", "suppress_tokens")
    off = config.for_call({"repetition_penalty": 1.0, "suppress_tokens": []})
    assert not off.active
    assert config.for_call({"min_new_tokens": 2}, eos_token_ids=[]).names == config.names
    with pytest.raises(InputError) as info:
        config.for_call({"max_tokens": 3})
    assert info.value.where == "max_tokens" and "repetition_penalty" in info.value.fix
    for eos in (["2"], [2.0], "2", 7):
        with pytest.raises(InputError) as info:
            config.for_call({}, eos)
        assert info.value.where == "eos_token_id"


def test_an_eos_id_outside_the_vocabulary_bans_nothing():
    # transformers' isin over the vocabulary ignores it; indexing with it would crash
    ours = LogitProcessors.from_config({"min_new_tokens": 4}, VOCAB, (2, VOCAB + 5))
    got = ours.apply(np.zeros((1, VOCAB), np.float32), [ours.history([1], 1, 9)])
    assert np.isneginf(got[0]).tolist() == [t == 2 for t in range(VOCAB)]


def test_not_applied_names_what_transformers_would_act_on():
    assert logit_processors.not_applied({"num_beams": 4, "guidance_scale": 1.0, "min_p": 0.1,
                                         "typical_p": 1.0, "top_k": 50}) == ["num_beams", "min_p"]


# -- the Scheduler ----------------------------------------------------------------------------
def _sequences(processors, sampling=GREEDY):
    rng = np.random.default_rng(0)
    return [Sequence([4], 3, sampling, rng=rng, processors=processors),
            Sequence([4], 3, sampling, rng=rng)]


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(True, 1e-3, seed=1)])
def test_the_scheduler_processes_only_the_rows_of_sequences_with_processors(sampling):
    # the fake model's next token is last + 1; suppressing 5 and 7 moves one sequence only
    suppress = LogitProcessors.from_config({"suppress_tokens": [5, 7]}, 256)
    scheduler = Scheduler(FakeRunner())
    processed, plain = _sequences(suppress, sampling)
    assert processed.history is not None and plain.history is None
    assert Sequence([4], 3, processors=LogitProcessors({}, 256)).history is None
    for seq in (processed, plain):
        scheduler.add(seq)
    events = list(scheduler.run())
    assert plain.generated == [5, 6, 7]
    # greedy: the first of the zeros (token 0) after 4, then 1 and 2; sampled at a tiny
    # temperature among the tied zeros: anything but the suppressed tokens
    if not sampling.do_sample:
        assert processed.generated == [0, 1, 2]
    assert not {5, 7} & set(processed.generated) and len(processed.generated) == 3
    assert all(e.error is None for e in events)


def test_processors_that_leave_no_token_end_the_sequence_saying_so():
    everything = LogitProcessors.from_config({"suppress_tokens": list(range(256))}, 256)
    scheduler = Scheduler(FakeRunner())
    processed, plain = _sequences(everything)
    for seq in (processed, plain):
        scheduler.add(seq)
    events = list(scheduler.run())
    assert processed.finish_reason == "error" and "suppress_tokens" in processed.error
    assert [e.token for e in events if e.sequence is plain] == [5, 6, 7]
