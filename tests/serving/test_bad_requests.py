"""Whatever a client sends, `dayzero serve` answers 400 naming the field (never a 500) and keeps
serving: each bad input the API can get, then random JSON for every field."""

from __future__ import annotations

import json
from types import SimpleNamespace

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.serving.protocol import ProtocolError, parse_request

HELLO = {"model": "lm.dz", "prompt": "hello world"}
CHAT = {"model": "lm.dz", "messages": [{"role": "user", "content": "hello"}]}

BAD = [
    ("/v1/completions", b"{bad", "body"),
    ("/v1/completions", b"[1, 2]", "body"),
    ("/v1/completions", b"\xff\xfe", "body"),
    ("/v1/completions", {"prompt": "hello"}, "model"),
    ("/v1/completions", {**HELLO, "model": "gpt-4"}, "model"),
    ("/v1/completions", {**HELLO, "prompt": [5] * 300}, "prompt"),  # longer than the context
    ("/v1/completions", {**HELLO, "prompt": [5] * 250, "max_tokens": 10}, "max_tokens"),
    ("/v1/completions", {**HELLO, "prompt": 5}, "prompt"),
    ("/v1/completions", {**HELLO, "prompt": [1, "a"]}, "prompt"),
    ("/v1/completions", {**HELLO, "prompt": [999]}, "prompt"),
    ("/v1/completions", {**HELLO, "prompt": ""}, "prompt"),
    ("/v1/completions", {**HELLO, "prompt": ["a b", "c d"]}, "prompt"),
    ("/v1/completions", {**HELLO, "max_tokens": -1}, "max_tokens"),
    ("/v1/completions", {**HELLO, "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {**HELLO, "max_tokens": "10"}, "max_tokens"),
    ("/v1/completions", {**HELLO, "max_tokens": 2.5}, "max_tokens"),
    ("/v1/completions", {**HELLO, "temperature": "hot"}, "temperature"),
    ("/v1/completions", {**HELLO, "temperature": -1}, "temperature"),
    ("/v1/completions", {**HELLO, "top_p": 0}, "top_p"),
    ("/v1/completions", {**HELLO, "stop": 5}, "stop"),
    ("/v1/completions", {**HELLO, "stop": ["a", ""]}, "stop"),
    ("/v1/completions", {**HELLO, "seed": -1}, "seed"),
    ("/v1/completions", {**HELLO, "seed": "7"}, "seed"),
    ("/v1/completions", {**HELLO, "n": 2}, "n"),
    ("/v1/completions", {**HELLO, "stream": "yes"}, "stream"),
    ("/v1/completions", {**HELLO, "echo": True}, "echo"),
    ("/v1/completions", {**HELLO, "stream": True, "stream_options": {"include_usage": 1}},
     "stream_options.include_usage"),
    ("/v1/chat/completions", {**CHAT, "messages": "hello"}, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": []}, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user"}]}, "messages[0].content"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"content": "hi"}]}, "messages[0].role"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
     "messages[0].content[0]"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": -3}, "max_completion_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 999}, "max_completion_tokens"),
]


@pytest.mark.parametrize("path,body,field", BAD,
                         ids=[f"{p.removeprefix('/v1/').replace('/', '-')}-{f}-{i}"
                              for i, (p, _, f) in enumerate(BAD)])
def test_a_bad_request_is_a_400_naming_the_field(server, path, body, field):
    status, answer = server.post(path, body)
    assert status == 400, answer
    assert answer["error"]["param"] == field, answer
    assert answer["error"]["type"] == "invalid_request_error"


def test_the_openai_client_sees_the_400(server):
    with pytest.raises(openai.BadRequestError) as caught:
        server.client().completions.create(model="lm.dz", prompt="hello", n=2)
    assert caught.value.status_code == 400 and caught.value.body["param"] == "n"


def test_messages_without_a_chat_template_are_a_400(reference):
    tokenizer = SimpleNamespace(chat_template=None, encode=reference.tokenizer.encode)
    model = SimpleNamespace(tokenizer=tokenizer, spec=reference.spec, runner=reference.runner)
    with pytest.raises(ProtocolError, match="no chat template") as caught:
        parse_request(CHAT, True, "lm.dz", model)
    assert caught.value.field == "messages" and caught.value.status == 400


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-10**20, 10**20)
                     | st.floats(allow_nan=False) | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)


_ABSENT = object()
# a valid body, then up to three of its fields replaced by random JSON (or dropped)
_VALID = {
    "model": st.just("lm.dz"),
    "prompt": st.sampled_from(["hello world", "the cat sat"])
    | st.lists(st.integers(0, 255), min_size=1, max_size=6),
    "messages": st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant"]),
         "content": st.text(max_size=10)}), min_size=1, max_size=2),
    "max_tokens": st.integers(1, 6),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "stop": st.just(_ABSENT) | st.text(min_size=1, max_size=4)
    | st.lists(st.text(min_size=1, max_size=4), max_size=4),
    "seed": st.just(_ABSENT) | st.integers(0, 2**32),
    "n": st.just(1),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
}


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]),
       valid=st.fixed_dictionaries(_VALID),
       broken=st.dictionaries(st.sampled_from(sorted(_VALID)), st.just(_ABSENT) | _JSON,
                              max_size=3))
def test_random_request_bodies_never_get_a_500(server, path, valid, broken):
    body = {k: v for k, v in {**valid, **broken}.items() if v is not _ABSENT}
    status, answer = server.post(path, json.dumps(body).encode())
    assert status in (200, 400), (body, status, answer)
    if status == 400:
        assert isinstance(answer["error"]["param"], str), answer


def test_the_server_is_still_healthy_after_the_fuzz(server):
    assert server.get("/health")[0] == 200
    assert server.metric("dayzero_kv_blocks_used") == 0
    assert server.client().completions.create(model="lm.dz", prompt="hello", max_tokens=2,
                                              temperature=0).usage.completion_tokens == 2
