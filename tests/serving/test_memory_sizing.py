"""The KV cache sized by itself (issue 39, item 4): `--kv-cache-memory auto` takes what
`--max-model-len` x `--max-num-seqs` tokens need, in whole blocks, at most half the memory
available after the weights and the arena; an explicit size beyond the memory is refused with
the numbers; `--max-model-len` bounds prompt and new tokens; a real `dayzero serve` prints one
ready line."""

from __future__ import annotations

import math
import re

import pytest

from compiler.errors import DayzeroError, InputError
from runtime import host_memory
from runtime.generation.spec import auto_cache_memory
from runtime.serving.memory import load_served
from tests.serving.servers import Server

READY = re.compile(r"^ready: http://127\.0\.0\.1:(\d+), model (\S+), KV cache (\d+) tokens$")


def _blocks(model) -> int:
    return model.runner.allocator.num_blocks


def test_auto_takes_the_context_times_the_sequences_in_whole_blocks(artifact, monkeypatch):
    monkeypatch.setattr(host_memory, "available_bytes", lambda *a: 1 << 40)
    model, context = load_served(artifact, "auto", max_model_len=100, max_num_seqs=3)
    spec = model.spec
    assert context == 100 and spec.block_size == 16
    assert _blocks(model) == math.ceil(100 * 3 / 16) == 19  # rounded up
    assert model.runner.cache_bytes == 19 * spec.cache_layout().block_bytes
    assert auto_cache_memory(spec, 300, None) == model.runner.cache_bytes


def test_auto_defaults_to_the_artifacts_context_and_256_sequences(artifact, monkeypatch):
    monkeypatch.setattr(host_memory, "available_bytes", lambda *a: 1 << 40)
    model, context = load_served(artifact)
    assert context == model.spec.max_positions == 256
    assert _blocks(model) == 256 * 256 // 16


def test_auto_is_capped_at_half_the_memory_available(artifact, monkeypatch):
    import runtime

    block = runtime.load(artifact, kv_cache_memory="4MiB").spec.cache_layout().block_bytes
    # after the probe: 1000 blocks' worth free, its pool given back
    free = 1000 * block + 7
    seen = []

    def available(*_):
        seen.append(1)
        return free

    monkeypatch.setattr(host_memory, "available_bytes", available)
    model, _ = load_served(artifact, "auto", max_model_len=256, max_num_seqs=256)
    probe = model.spec.max_batch_tokens  # the probe's pool went back to the free memory
    probe_blocks = math.ceil(probe / min(model.spec.prefill_chunk, probe, 255)) * \
        math.ceil(min(model.spec.prefill_chunk, probe, 255) / 16)
    assert seen, "the available memory was never read"
    assert _blocks(model) == int((free + probe_blocks * block) * 0.5) // block
    assert _blocks(model) < 256 * 256 // 16


def test_an_explicit_size_beyond_the_memory_is_refused_with_the_numbers(artifact):
    free = host_memory.available_bytes()
    if free is None:
        pytest.skip("this system does not say how much memory is available")
    with pytest.raises(InputError) as caught:
        load_served(artifact, "1000TiB")
    message = str(caught.value)
    assert str(1000 * 2**40) in message and "bytes" in message and "available" in message
    assert re.search(r"more than the \d+ bytes", message)


def test_max_model_len_beyond_the_artifact_is_refused(artifact):
    with pytest.raises(DayzeroError) as caught:
        load_served(artifact, "4MiB", max_model_len=257)
    assert caught.value.where == "--max-model-len" and "256" in caught.value.what


def test_a_served_max_model_len_bounds_prompt_and_new_tokens(artifact, tmp_path):
    server = Server(artifact, tmp_path / "server.log", "--kv-cache-memory", "auto",
                    "--max-model-len", "40", "--max-num-seqs", "4")
    try:
        status, answer = server.post("/v1/completions", {
            "model": "lm.dz", "prompt": list(range(3, 33)), "max_tokens": 11})
        assert status == 400 and answer["error"]["param"] == "max_tokens", answer
        assert "40 positions" in answer["error"]["message"]
        status, answer = server.post("/v1/completions", {
            "model": "lm.dz", "prompt": list(range(3, 33)), "max_tokens": 10,
            "temperature": 0})
        assert status == 200, answer
        status, answer = server.post("/v1/completions", {
            "model": "lm.dz", "prompt": list(range(3, 43))})
        assert status == 400 and answer["error"]["param"] == "prompt", answer
        assert '"max_model_len": 40' in server.get("/v1/models")[1].replace(":40", ": 40")
    finally:
        assert server.stop() == 0
    lines = server.log.read_text().splitlines()
    ready = [m for m in map(READY.match, lines) if m]
    assert len(ready) == 1, lines  # exactly one line, once healthy
    port, name, tokens = ready[0].groups()
    assert int(port) == server.port and name == "lm.dz"
    assert int(tokens) == math.ceil(40 * 4 / 16) * 16  # the auto size, in tokens


def test_the_default_server_prints_its_ready_line_once(server):
    lines = server.log.read_text().splitlines()
    ready = [m for m in map(READY.match, lines) if m]
    assert len(ready) == 1, lines
    assert int(ready[0].group(1)) == server.port
    assert int(ready[0].group(3)) > 0


@pytest.mark.parametrize("method, path, status, kind", [
    ("GET", "/nope", 404, "not_found_error"), ("GET", "/v1/completions", 405,
                                                "invalid_request_error"),
    ("DELETE", "/v1/models", 405, "invalid_request_error")])
def test_404_and_405_are_in_openais_error_shape(server, method, path, status, kind):
    import json
    import urllib.error
    import urllib.request

    request = urllib.request.Request(server.url + path, method=method)
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == status
    error = json.loads(caught.value.read())["error"]
    assert error["type"] == kind and isinstance(error["message"], str) and "param" in error


def test_max_num_seqs_bounds_the_sequences_generated_at_once(artifact):
    import threading

    import runtime
    from tests.serving.inprocess import InProcessServer

    server = InProcessServer(runtime.load(artifact, kv_cache_memory="4MiB"))
    try:
        server.engine.max_num_seqs = 2
        scheduler = server.engine.scheduler
        most, step = [0], scheduler.step

        def counted():
            most[0] = max(most[0], len(scheduler.running) + len(scheduler.waiting))
            return step()

        scheduler.step = counted
        body = {"model": "lm.dz", "prompt": [1, 3, 4], "max_tokens": 12, "temperature": 0}
        answers = [None] * 6

        def send(i):
            answers[i] = server.request("POST", "/v1/completions", body)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert all(a is not None and a[0] == 200 for a in answers), answers
        assert len({tuple(a[1]["choices"][0]["token_ids"]) for a in answers}) == 1
        assert most[0] == 2  # two at a time, the others waited their turn
    finally:
        server.close()
