"""Hostile request bodies: every field is checked before any work and answered with a 400 naming
it (a lone surrogate anywhere, nesting, a prompt longer than the context can hold, refused
before the tokenizer sees it); a temperature that underflows is greedy; a body over 16 MiB is a
413 before it is read, one that never arrives a 408; the framework's own errors are in OpenAI's
shape too."""

from __future__ import annotations

import json
import socket
import time
from types import SimpleNamespace

import pytest

from runtime.serving.bounds import MAX_DEPTH
from runtime.serving.protocol import ProtocolError, parse_request
from tests.serving.inprocess import GatedTokenizer, InProcessServer
from tests.serving.servers import KV_CACHE

HELLO = '"model": "lm.dz", "prompt": "hello world", "max_tokens": 2'
CHAT = '"model": "lm.dz", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]'
S = "\\ud800"  # a lone surrogate, as JSON text

SURROGATES = [
    ("/v1/completions", f'{{"model": "lm{S}", "prompt": "hello"}}', "model"),
    ("/v1/completions", f'{{{HELLO}, "prompt": "hello {S} world"}}', "prompt"),
    ("/v1/completions", f'{{{HELLO}, "prompt": ["x{S}"]}}', "prompt[0]"),
    ("/v1/completions", f'{{{HELLO}, "stop": ["a", "\\udfff"]}}', "stop[1]"),
    ("/v1/completions", f'{{{HELLO}, "user": "{S}"}}', "user"),
    ("/v1/completions", f'{{{HELLO}, "metadata": {{"k": [1, "{S}"]}}}}', "metadata.k[1]"),
    ("/v1/completions", f'{{{HELLO}, "{S}": 1}}', "\\ud800"),
    ("/v1/chat/completions", f'{{"model": "lm.dz", "messages": [{{"role": "{S}", '
                             '"content": "hi"}]}', "messages[0].role"),
    ("/v1/chat/completions", f'{{"model": "lm.dz", "messages": [{{"role": "user", '
                             f'"content": "hi {S}"}}]}}', "messages[0].content"),
    ("/v1/chat/completions", f'{{"model": "lm.dz", "messages": [{{"role": "user", "content": '
                             f'[{{"type": "text", "text": "{S}"}}]}}]}}',
     "messages[0].content[0].text"),
]


@pytest.mark.parametrize("path,body,field", SURROGATES,
                         ids=[f for _, _, f in SURROGATES])
def test_a_lone_surrogate_anywhere_is_a_400_naming_the_field(server, path, body, field):
    status, answer = server.post(path, body.encode())
    assert status == 400, answer
    assert answer["error"]["param"] == field, answer
    assert "surrogate" in answer["error"]["message"]


def test_a_surrogate_pair_is_text_and_is_served(server):
    status, answer = server.post("/v1/completions",
                                 f'{{{HELLO}, "prompt": "hello \\ud83d\\ude00"}}'.encode())
    assert status == 200, answer


@pytest.mark.parametrize("temperature", ["1e-320", "5e-324", "0", "-0.0"])
def test_a_temperature_that_underflows_is_greedy(server, reference, temperature):
    ids = reference.tokenizer.encode("hello world the model runs")
    want = reference.generate([ids], max_new_tokens=6)[0, len(ids):].tolist()
    body = (f'{{"model": "lm.dz", "prompt": {json.dumps(ids)}, "max_tokens": 6, '
            f'"temperature": {temperature}, "seed": 3}}')
    status, answer = server.post("/v1/completions", body.encode())
    assert status == 200, answer
    assert answer["choices"][0]["token_ids"] == want


@pytest.mark.parametrize("temperature", ["NaN", "Infinity", "-Infinity", "-1e-320", "2.5",
                                         "1e400"])
def test_a_temperature_out_of_range_is_a_400(server, temperature):
    status, answer = server.post("/v1/completions",
                                 f'{{{HELLO}, "temperature": {temperature}}}'.encode())
    assert status == 400 and answer["error"]["param"] == "temperature", answer


def test_nesting_deeper_than_the_api_is_refused_naming_the_path(server):
    deep = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    status, answer = server.post("/v1/completions", f'{{{HELLO}, "tools": {deep}}}'.encode())
    assert status == 400, answer
    assert answer["error"]["param"].startswith("tools[0][0]"), answer
    very = "[" * 5000 + "]" * 5000  # past the JSON decoder's own recursion limit
    status, answer = server.post("/v1/completions", f'{{{HELLO}, "x": {very}}}'.encode())
    assert status == 400 and answer["error"]["param"] == "body", answer


class _Counting(GatedTokenizer):
    """The real tokenizer, counting its calls."""


@pytest.fixture(scope="module")
def counting(reference):
    tokenizer = _Counting(reference.tokenizer)
    model = SimpleNamespace(tokenizer=tokenizer, spec=reference.spec, runner=reference.runner)
    return model, tokenizer


def test_a_prompt_longer_than_the_context_can_hold_is_refused_before_tokenizing(counting):
    model, tokenizer = counting
    calls = tokenizer.calls
    # the word tokenizer's entries are short: 64 characters a token, 256 positions
    with pytest.raises(ProtocolError, match="16385 characters") as caught:
        parse_request({"model": "lm.dz", "prompt": "a" * 16385}, False, "lm.dz", model)
    assert caught.value.field == "prompt" and tokenizer.calls == calls
    # what fits is tokenized (and then counted in tokens)
    with pytest.raises(ProtocolError, match="tokens"):
        parse_request({"model": "lm.dz", "prompt": "a " * 8000}, False, "lm.dz", model)
    assert tokenizer.calls == calls + 1


def test_chat_messages_are_bounded_before_the_template_renders(counting):
    model, tokenizer = counting
    calls = tokenizer.calls
    long = [{"role": "user", "content": "a" * 10000}, {"role": "user", "content": [
        {"type": "text", "text": "b" * 7000}]}]
    with pytest.raises(ProtocolError, match="characters") as caught:
        parse_request({"model": "lm.dz", "messages": long}, True, "lm.dz", model)
    assert caught.value.field == "messages"
    many = [{"role": "user", "content": ""}] * 257
    with pytest.raises(ProtocolError, match="257 messages") as caught:
        parse_request({"model": "lm.dz", "messages": many}, True, "lm.dz", model)
    assert tokenizer.calls == calls


def test_every_option_is_checked_before_the_prompt_is_tokenized(counting):
    model, tokenizer = counting
    calls = tokenizer.calls
    for field, value in (("temperature", -1), ("stop", 5), ("max_tokens", "2"),
                         ("stream", "yes"), ("seed", -1), ("top_p", 0)):
        with pytest.raises(ProtocolError) as caught:
            parse_request({"model": "lm.dz", "prompt": "hello", field: value}, False, "lm.dz",
                          model)
        assert caught.value.field == field
    assert tokenizer.calls == calls


def test_a_token_id_prompt_is_counted_before_it_is_read(server):
    status, answer = server.post("/v1/completions", {"model": "lm.dz",
                                                     "prompt": [5] * 300 + ["x"]})
    assert status == 400 and answer["error"]["param"] == "prompt", answer
    assert "301 tokens" in answer["error"]["message"]


def test_a_stop_string_longer_than_any_generation_is_refused(server):
    status, answer = server.post("/v1/completions", {"model": "lm.dz", "prompt": "hello",
                                                     "stop": ["x", "y" * 20000]})
    assert status == 400 and answer["error"]["param"] == "stop[1]", answer


def test_unknown_paths_and_methods_answer_in_openai_shape(server):
    status, text = server.get("/v1/nothing")
    assert status == 404 and json.loads(text)["error"]["type"] == "not_found_error"
    status, text = server.get("/v1/completions")
    assert status == 405 and "message" in json.loads(text)["error"]


def _raw(port: int, head: bytes, body: bytes = b"", timeout: float = 10) -> tuple[int, dict]:
    """Send a request's head (and some body) on a socket; the status and JSON body answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
        connection.sendall(head + body)
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
            chunk = connection.recv(65536)
            if not chunk:
                break
            data += chunk
    head_text, _, payload = data.partition(b"\r\n\r\n")
    return int(head_text.split()[1]), json.loads(payload)


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 1 << 30


def test_a_declared_body_over_16_mib_is_a_413_before_it_is_sent(server):
    started = time.monotonic()
    status, answer = _raw(server.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Type: application/json\r\nContent-Length: 100000000\r\n\r\n")
    assert status == 413 and answer["error"]["param"] == "body", answer
    assert time.monotonic() - started < 5


def test_a_chunked_body_over_16_mib_is_a_413(server):
    chunk = b"x" * (1 << 20)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as connection:
        connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                           b"application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            for _ in range(20):  # 20 MiB, never finished: the server stops reading at 16
                connection.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except OSError:  # it closed the connection after answering
            pass
        data = b""
        while True:
            try:
                piece = connection.recv(65536)
            except OSError:
                break
            if not piece:
                break
            data += piece
    assert data.startswith(b"HTTP/1.1 413"), data[:200]
    assert json.loads(data.partition(b"\r\n\r\n")[2])["error"]["param"] == "body"
    assert server.get("/health")[0] == 200


@pytest.fixture(scope="module")
def quick_timeouts(artifact):
    import runtime

    model = runtime.load(artifact, kv_cache_memory=KV_CACHE)
    srv = InProcessServer(model, body_timeout=0.5)
    yield srv
    srv.close()


def test_a_body_that_never_arrives_is_a_408(quick_timeouts):
    started = time.monotonic()
    status, answer = _raw(quick_timeouts.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Length: 1000\r\n\r\n", b'{"model": ')
    assert status == 408 and answer["error"]["param"] == "body", answer
    assert 0.4 < time.monotonic() - started < 5
    assert quick_timeouts.metrics.requests.labels("/v1/completions", "408")._value.get() == 1
    status, answer = quick_timeouts.request("POST", "/v1/completions", {
        "model": "lm.dz", "prompt": "hello", "max_tokens": 2})
    assert status == 200, answer  # a whole body in time is served as ever


def test_serve_refuses_a_body_timeout_that_is_not_positive(artifact, capsys):
    from compiler.cli import main

    assert main(["serve", str(artifact), "--body-timeout", "0"]) == 1
    assert "--body-timeout" in capsys.readouterr().err
