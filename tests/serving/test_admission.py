"""Who gets in and when it stops: a full queue answers 429 with Retry-After, SIGTERM drains
(health 503, the request in flight finishes, exit 0), and `dayzero serve` refuses what it
cannot serve before opening a port."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from compiler.cli import main
from tests.serving.servers import Server


def test_a_full_queue_answers_429_with_retry_after(artifact, tmp_path):
    # one request may wait for its first token; a 2-token budget makes a 200-token prompt
    # take 100 steps to read, so the others arrive while it waits
    server = Server(artifact, tmp_path / "log", "--max-queue", "1", "--max-batch-tokens", "2")
    try:
        client = server.client()

        def ask(i: int):
            try:
                return client.completions.create(model="lm.dz", prompt=[5 + i] * 200,
                                                 max_tokens=2, temperature=0)
            except openai.RateLimitError as exc:
                return exc

        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(ask, range(6)))
        refused = [a for a in answers if isinstance(a, openai.RateLimitError)]
        served = [a for a in answers if not isinstance(a, Exception)]
        assert refused and served and len(refused) + len(served) == 6, answers
        assert all(int(r.response.headers["retry-after"]) >= 1 for r in refused)
        assert server.metric('dayzero_requests_total{endpoint="/v1/completions",'
                             'status="429"}') == len(refused)
        assert server.get("/health")[0] == 200
    finally:
        assert server.stop() == 0


def test_preempted_requests_still_say_what_generate_says(artifact, reference, tmp_path):
    # 20 blocks of 16 tokens (8 KiB each): four requests of 140 tokens need 36
    server = Server(artifact, tmp_path / "log", "--kv-cache-memory", str(20 * 8192))
    try:
        prompts = [[10 + i + j % 7 for j in range(40)] for i in range(4)]
        want = [reference.generate([p], max_new_tokens=100)[0, 40:].tolist() for p in prompts]
        client = server.client()

        def ask(prompt):
            return client.completions.create(model="lm.dz", prompt=prompt, max_tokens=100,
                                             temperature=0).choices[0].model_extra["token_ids"]

        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(ask, prompts)) == want
        assert server.metric("dayzero_preemptions_total") > 0
        assert server.metric("dayzero_kv_blocks_free") == 20
    finally:
        assert server.stop() == 0


def test_sigterm_drains_the_request_in_flight_then_exits_0(artifact, tmp_path):
    server = Server(artifact, tmp_path / "log")
    answer = {}

    def long_request():
        answer["status"], answer["body"] = server.post("/v1/completions", {
            "model": "lm.dz", "prompt": [5, 6, 7], "max_tokens": 240, "temperature": 0})

    thread = threading.Thread(target=long_request)
    thread.start()
    deadline = time.monotonic() + 10
    while server.metric("dayzero_running_sequences") < 1:
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.01)
    server.process.terminate()  # SIGTERM
    deadline = time.monotonic() + 5
    while server.get("/health")[0] != 503:
        assert time.monotonic() < deadline and thread.is_alive(), "health never said 503"
        time.sleep(0.01)
    status, late = server.post("/v1/completions", {"model": "lm.dz", "prompt": "hello"})
    assert status == 503, late
    thread.join(30)
    assert answer["status"] == 200, answer
    assert answer["body"]["choices"][0]["finish_reason"] == "length"
    assert answer["body"]["usage"]["completion_tokens"] == 240
    assert server.process.wait(30) == 0, server.log.read_text()


def test_past_the_drain_timeout_the_rest_is_cancelled(artifact, tmp_path):
    server = Server(artifact, tmp_path / "log", "--drain-timeout", "0")
    stream = server.client().completions.create(model="lm.dz", prompt=[5, 6, 7],
                                                max_tokens=240, temperature=0, stream=True)
    chunks = iter(stream)
    first = next(chunks)
    server.process.terminate()
    rest = list(chunks)  # the stream closes early: its sequence was cancelled
    tokens = sum(len(c.choices[0].model_extra["token_ids"]) for c in [first, *rest])
    assert tokens < 240 and rest[-1].choices[0].finish_reason == "stop"
    assert server.process.wait(30) == 0, server.log.read_text()


def test_the_engine_admits_nothing_before_its_warm_up(reference):
    from runtime.serving.engine import Engine, NotAccepting
    from runtime.serving.metrics import Metrics

    engine = Engine(reference, Metrics())
    assert engine.state == "loading"
    with pytest.raises(NotAccepting):
        engine.submit(None, None)
    engine.start()
    assert engine.ready.wait(30) and engine.state == "ok"
    engine.begin_drain()
    assert engine.state == "draining"
    engine.stop()
    assert not engine.thread.is_alive()


def test_serve_refuses_nproc_and_forward_artifacts(artifact, tmp_path, capsys):
    assert main(["serve", str(artifact), "--nproc", "2"]) == 1
    assert "--nproc" in capsys.readouterr().err
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert main(["serve", str(artifact), "--max-batch-tokens",
                 str(manifest["generation"]["max_batch_tokens"] + 1)]) == 1
    assert "--max-batch-tokens" in capsys.readouterr().err
    assert main(["serve", str(artifact), "--session", "allow_spinning=sometimes"]) == 1
    assert "allow_spinning" in capsys.readouterr().err  # the setting reaches the session
    ckpt = artifact.parent / "ckpt"
    forward = tmp_path / "fwd.dz"
    assert main(["compile", str(ckpt), "-o", str(forward), "--seq-len", "2:64", "-q",
                 "--task", "forward"]) == 0
    capsys.readouterr()
    assert main(["serve", str(forward)]) == 1
    assert "--task text-generation" in capsys.readouterr().err


def test_serve_without_the_extra_says_how_to_install_it(artifact, monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn raises ImportError
    assert main(["serve", str(artifact)]) == 1
    assert "pip install -e '.[serve]'" in capsys.readouterr().err
