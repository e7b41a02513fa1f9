"""Every sampling field of a request is honoured or refused (issue 39, item 3): each one against
a float64 reference of its formula over the served model's own logits (its prefill forward,
greedy step by step), and every field the server does not implement a 400 naming it."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.serving.fields import NO_OPS, REFUSED
from tests.serving.inprocess import InProcessServer
from tests.serving.servers import KV_CACHE

PROMPT = [1, 3, 4]  # "hello world"
EOS = 2


@pytest.fixture(scope="module")
def served(artifact):
    import runtime

    server = InProcessServer(runtime.load(artifact, kv_cache_memory=KV_CACHE))
    yield server
    server.close()


def _complete(server, **fields):
    status, answer = server.request("POST", "/v1/completions", {
        "model": "lm.dz", "prompt": PROMPT, "temperature": 0, **fields})
    assert status == 200, answer
    return answer["choices"][0]


def _greedy(reference, steps: int, processed) -> list[int]:
    """Greedy tokens from the model's float32 logits made float64, each step's row passed
    through `processed(logits, generated)` (the field's formula)."""
    generated: list[int] = []
    for _ in range(steps):
        logits = reference(np.array([PROMPT + generated]))[0][0, -1].astype(np.float64)
        token = int(np.argmax(processed(logits.copy(), generated)))
        generated.append(token)
        if token == EOS:
            break
    return generated


def _openai_penalties(frequency: float, presence: float):
    def processed(logits, generated):
        for token in set(generated):  # the generated tokens only, not the prompt
            logits[token] -= frequency * generated.count(token) + presence
        return logits
    return processed


@pytest.mark.parametrize("frequency, presence", [(1.5, 0.0), (0.0, 2.0), (0.75, 0.5),
                                                 (-0.5, 0.0)])
def test_frequency_and_presence_penalties_are_openais_formula(served, reference, frequency,
                                                              presence):
    want = _greedy(reference, 8, _openai_penalties(frequency, presence))
    plain = _greedy(reference, 8, lambda logits, generated: logits)
    if frequency > 0 or presence > 0:
        assert want != plain  # the penalty changes the answer: the comparison can fail
    got = _complete(served, max_tokens=8, frequency_penalty=frequency,
                    presence_penalty=presence)
    assert got["token_ids"] == want


def test_repetition_penalty_is_transformers_over_prompt_and_generated(served, reference):
    def processed(logits, generated):
        for token in set(PROMPT + generated):
            logits[token] = logits[token] / 3.0 if logits[token] > 0 else logits[token] * 3.0
        return logits
    want = _greedy(reference, 8, processed)
    assert want != _greedy(reference, 8, lambda logits, generated: logits)
    assert _complete(served, max_tokens=8, repetition_penalty=3.0)["token_ids"] == want


def test_logit_bias_forces_and_bans_tokens(served, reference):
    plain = _greedy(reference, 4, lambda logits, generated: logits)
    assert _complete(served, max_tokens=4, logit_bias={"9": 100})["token_ids"] == [9] * 4
    banned = {str(t): -100 for t in set(plain)}

    def processed(logits, generated):
        for token, bias in banned.items():
            logits[int(token)] += bias
        return logits
    want = _greedy(reference, 4, processed)
    assert not set(want) & set(plain)
    assert _complete(served, max_tokens=4, logit_bias=banned)["token_ids"] == want


def test_min_tokens_holds_the_end_back(served, reference):
    def processed(logits, generated):
        logits[EOS] += 100  # the end as likely as can be ...
        if len(generated) < 3:
            logits[EOS] = -np.inf  # ... but not before three tokens
        return logits
    want = _greedy(reference, 6, processed)
    assert len(want) == 4 and want[-1] == EOS
    got = _complete(served, max_tokens=6, min_tokens=3, logit_bias={str(EOS): 100})
    assert got["token_ids"] == want and got["finish_reason"] == "stop"
    early = _complete(served, max_tokens=6, logit_bias={str(EOS): 100})
    assert early["token_ids"] == [EOS]


def test_stop_token_ids_end_the_answer_as_eos_does(served, reference):
    plain = _greedy(reference, 6, lambda logits, generated: logits)
    stop = next(t for t in plain if t != plain[0])
    got = _complete(served, max_tokens=6, stop_token_ids=[stop])
    assert got["token_ids"] == plain[:plain.index(stop) + 1]
    assert got["finish_reason"] == "stop"
    held = _complete(served, max_tokens=6, stop_token_ids=[stop], min_tokens=6)
    assert held["finish_reason"] == "length" and stop not in held["token_ids"]


def test_top_k_one_samples_the_greedy_answer(served, reference):
    plain = _greedy(reference, 8, lambda logits, generated: logits)
    got = _complete(served, max_tokens=8, temperature=1.8, top_k=1, seed=5)
    assert got["token_ids"] == plain
    wide = _complete(served, max_tokens=8, temperature=1.8, seed=5)
    assert wide["token_ids"] != plain  # without top_k the same draws sample elsewhere


def test_top_k_and_seed_sample_as_generate_does(served, reference):
    want = reference.generate(np.array([PROMPT]), max_new_tokens=8, do_sample=True,
                              temperature=1.3, top_k=5, seed=11)[0, len(PROMPT):].tolist()
    want = [t for t in want if t != -1]
    got = _complete(served, max_tokens=8, temperature=1.3, top_k=5, seed=11)
    assert got["token_ids"] == want


def test_the_python_api_takes_the_same_penalties(reference):
    want = _greedy(reference, 6, _openai_penalties(1.0, 0.5))
    got = reference.generate(np.array([PROMPT]), max_new_tokens=6, frequency_penalty=1.0,
                             presence_penalty=0.5)[0, len(PROMPT):].tolist()
    assert [t for t in got if t != -1] == want


@pytest.mark.parametrize("path, field, value", [
    *[("/v1/completions", name, "x") for name in sorted(REFUSED[False])],
    *[("/v1/chat/completions", name, "x") for name in sorted(REFUSED[True])],
    ("/v1/chat/completions", "response_format", {"type": "json_object"}),
    ("/v1/chat/completions", "tools", [{"type": "function", "function": {"name": "f"}}]),
    ("/v1/completions", "logprobs", 2), ("/v1/chat/completions", "logprobs", True),
    ("/v1/completions", "n", 2), ("/v1/completions", "suffix", "end"),
    ("/v1/chat/completions", "store", True), ("/v1/chat/completions", "service_tier", "flex"),
    ("/v1/completions", "min_p", 0.1), ("/v1/completions", "ignore_eos", True),
    ("/v1/chat/completions", "guided_json", {}), ("/v1/completions", "messages", []),
    ("/v1/chat/completions", "prompt", "hi"), ("/v1/completions", "max_completion_tokens", 4),
])
def test_a_field_not_implemented_is_a_400_naming_it(served, path, field, value):
    body = {"model": "lm.dz", "max_tokens": 2, field: value}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if "chat" in path
                else {"prompt": "hello"})
    if field in ("messages", "prompt"):
        body[field] = value
    status, answer = served.request("POST", path, body)
    assert status == 400, answer
    assert answer["error"]["param"] == field and answer["error"]["type"] == \
        "invalid_request_error"


@pytest.mark.parametrize("field, value", [
    *[(name, "tag") for name in sorted(NO_OPS) if name != "service_tier"],
    ("service_tier", "auto"), ("response_format", {"type": "text"}), ("n", 1),
    ("logprobs", False), ("tools", []), ("store", False), ("metadata", {"k": "v"}),
])
def test_a_documented_no_op_or_default_is_accepted(served, field, value):
    status, answer = served.request("POST", "/v1/chat/completions", {
        "model": "lm.dz", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}],
        field: value})
    assert status == 200, answer


@pytest.mark.parametrize("field, value", [
    ("logit_bias", {"x": 1}), ("logit_bias", {"256": 1}), ("logit_bias", {"3": 101}),
    ("logit_bias", {"-1": 1}), ("logit_bias", [[3, 1]]), ("logit_bias", {"3": "1"}),
    ("frequency_penalty", 2.5), ("frequency_penalty", "1"), ("presence_penalty", -3),
    ("repetition_penalty", 0), ("repetition_penalty", -1.0), ("min_tokens", -1),
    ("min_tokens", 1.5), ("min_tokens", 5), ("top_k", 1.5), ("top_k", -2), ("top_k", True),
    ("stop_token_ids", [-1]), ("stop_token_ids", [256]), ("stop_token_ids", 3),
])
def test_a_bad_sampling_value_is_a_400_naming_the_field(served, field, value):
    status, answer = served.request("POST", "/v1/completions", {
        "model": "lm.dz", "prompt": PROMPT, "max_tokens": 4, field: value})
    assert status == 400, answer
    assert answer["error"]["param"] == field, answer
