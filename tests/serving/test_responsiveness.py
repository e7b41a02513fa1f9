"""The server never stalls: a request whose tokenizer or chat template takes long is read off
the event loop, so /health and other requests are answered before it ends (tested by order:
the slow one is held until the others came back); SIGTERM ends the process within the drain
timeout even while requests are still being read; a sequence the model fails ends alone with
finish_reason "error"."""

from __future__ import annotations

import threading
import time

import pytest

from tests.serving.inprocess import GatedTokenizer, InProcessServer, WithTokenizer
from tests.serving.servers import KV_CACHE, Server


@pytest.fixture(scope="module")
def model(artifact):
    import runtime

    return runtime.load(artifact, kv_cache_memory=KV_CACHE)


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"model": "lm.dz", "prompt": "SLOW hello", "max_tokens": 2}),
    ("/v1/chat/completions", {"model": "lm.dz", "max_tokens": 2,
                              "messages": [{"role": "user", "content": "SLOW hello"}]}),
], ids=["prompt", "chat"])
def test_health_and_other_requests_answer_while_a_slow_request_is_read(model, path, body):
    tokenizer = GatedTokenizer(model.tokenizer)
    server = InProcessServer(WithTokenizer(model, tokenizer))
    order, answers = [], {}

    def slow():
        answers["slow"] = server.request("POST", path, body, timeout=60)
        order.append("slow")

    thread = threading.Thread(target=slow)
    try:
        thread.start()
        assert tokenizer.entered.wait(10), "the slow request never reached the tokenizer"
        answers["health"] = server.request("GET", "/health", timeout=10)
        order.append("health")
        answers["fast"] = server.request("POST", "/v1/completions", {
            "model": "lm.dz", "prompt": "hello world", "max_tokens": 3}, timeout=10)
        order.append("fast")
        assert order == ["health", "fast"] and thread.is_alive()
    finally:
        tokenizer.gate.set()
        thread.join(60)
        server.close()
    assert order == ["health", "fast", "slow"]
    assert answers["health"][0] == 200 and answers["fast"][0] == 200, answers
    assert answers["slow"][0] == 200, answers


def test_sigterm_admits_what_is_read_in_time_and_exits_within_the_drain_timeout(artifact,
                                                                                tmp_path):
    """Two chats are being rendered when SIGTERM comes: one finishes rendering within the
    drain and is served; the other never does, is answered 503 at the drain's deadline, and
    the process exits 0 without waiting for its render."""
    gates = tmp_path / "gates"
    gates.mkdir()
    drain = 6.0  # wide enough for a loaded 2-core CI machine to render SLOWa after the gate opens
    server = Server(artifact, tmp_path / "log", "--drain-timeout", str(drain),
                    prelude="import tests.serving.slow_tokenizer",
                    env={"DAYZERO_TEST_GATES": str(gates)})
    answers: dict[str, tuple] = {}

    def chat(tag: str) -> None:
        answers[tag] = server.post("/v1/chat/completions", {
            "model": "lm.dz", "max_tokens": 3,
            "messages": [{"role": "user", "content": f"{tag} hello"}]})

    threads = [threading.Thread(target=chat, args=(tag,)) for tag in ("SLOWa", "SLOWb")]
    try:
        for thread in threads:
            thread.start()
        _wait_for(lambda: all((gates / f"entered-{t}").exists() for t in ("SLOWa", "SLOWb")))
        assert server.get("/health")[0] == 200  # answered while both are rendered
        started = time.monotonic()
        server.process.terminate()
        _wait_for(lambda: server.get("/health")[0] == 503)
        (gates / "open-SLOWa").touch()
        code = server.process.wait(drain + 15)
        elapsed = time.monotonic() - started
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()
        for thread in threads:
            thread.join(30)
    log = server.log.read_text()
    assert code == 0, log
    assert elapsed < drain + 8, (elapsed, log)
    status, answer = answers["SLOWa"]
    assert status == 200 and answer["usage"]["completion_tokens"] == 3, answers
    assert answers["SLOWb"][0] == 503, answers


def _wait_for(condition, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_a_drain_admits_requests_read_before_it_until_its_deadline(model):
    from runtime.serving.engine import Engine, NotAccepting
    from runtime.serving.metrics import Metrics

    engine = Engine(model, Metrics())
    loop = _loop()
    engine.start()
    try:
        assert engine.ready.wait(60), engine.failure
        engine.open_request()
        engine.open_request()
        engine.begin_drain()
        with pytest.raises(NotAccepting):
            engine.open_request()  # nothing new
        assert engine.reading == 2 and not engine.wait_idle(0.05)
        request = _request(model)
        job = engine.submit(request, loop, opened=True)  # read before the drain: admitted
        assert job.sequence.prompt_len == 3
        engine.close()
        with pytest.raises(NotAccepting):
            engine.submit(request, loop, opened=True)  # past the deadline: not even those
        assert engine.reading == 0
        assert engine.wait_idle(30)
    finally:
        engine.stop()
        loop.close()


def _request(model):
    from runtime.sampling import SamplingParams
    from runtime.serving.protocol import GenerationRequest

    return GenerationRequest(False, [5, 6, 7], 2, SamplingParams(), (), False, False)


def _loop():
    import asyncio

    return asyncio.new_event_loop()
