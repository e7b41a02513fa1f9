"""A tensor-parallel generation artifact (`parallel: {tensor_parallel: 2}`): the tiny Llama of
the serving tests split over 2 ranks (gloo on 127.0.0.1), driven from one process. Its greedy
tokens are the single-process artifact's and transformers' `generate`'s; `dayzero serve
--nproc 2` answers the openai client with them; a rank killed outright turns /health 503 and
ends the server with an error naming the rank, within seconds."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.serving.servers import KV_CACHE, Server

PROMPT = "hello world the model runs"


@pytest.fixture(scope="module")
def tp_artifact(artifact, tmp_path_factory) -> Path:
    from compiler.cli import main

    root = tmp_path_factory.mktemp("tp")
    config = root / "tp.yaml"
    config.write_text("parallel:\n  tensor_parallel: 2\n")
    out = root / "lm.dz"
    assert main(["compile", str(artifact.parent / "ckpt"), "-o", str(out), "--seq-len",
                 "2:256", "--config", str(config), "-q"]) == 0
    return out


@pytest.fixture
def tp_model(tp_artifact):
    import runtime

    model = runtime.load(tp_artifact, kv_cache_memory=KV_CACHE)
    yield model
    model.close()  # one tensor-parallel model per process at a time


def test_greedy_tokens_match_one_process_and_transformers(tp_model, reference, artifact):
    from transformers import AutoModelForCausalLM

    assert tp_model.ranks == 2
    prompts = [np.asarray(reference.tokenizer.encode(PROMPT)),
               np.asarray(reference.tokenizer.encode("a cat sat"))]
    got = tp_model.generate(prompts, max_new_tokens=16, eos_token_id=[], pad_token_id=0)
    assert np.array_equal(got, reference.generate(prompts, max_new_tokens=16, eos_token_id=[],
                                                  pad_token_id=0))
    hf = AutoModelForCausalLM.from_pretrained(artifact.parent / "ckpt").eval()
    ids = torch.as_tensor(prompts[0])[None]
    with torch.no_grad():
        want = hf.generate(ids, max_new_tokens=16, min_new_tokens=16, do_sample=False)
        logits = hf(ids).logits.numpy()
    assert got[0].tolist() == want[0].tolist()
    np.testing.assert_allclose(tp_model(ids.numpy())[0], logits, rtol=1e-4, atol=1e-4)
    # each rank's pool holds its half of the KV heads, with as many blocks as one process
    assert tp_model.runner.layout.kv_heads == 1
    assert tp_model.runner.allocator.num_blocks == reference.runner.allocator.num_blocks
    assert tp_model.runner.allocator.used == 0


def test_dayzero_generate_drives_the_ranks(tp_artifact, reference, capsys):
    from compiler.cli import main

    ids = reference.tokenizer.encode(PROMPT)
    out = reference.generate([ids], max_new_tokens=8)
    assert main(["generate", str(tp_artifact), "--prompt", PROMPT, "--max-new-tokens", "8",
                 "--kv-cache-memory", KV_CACHE]) == 0
    printed = capsys.readouterr()
    assert printed.out.strip() == reference.tokenizer.decode(out[0, len(ids):].tolist())
    assert "over 2 ranks" in printed.err


def test_serve_nproc_2_answers_then_a_dead_rank_ends_it(tp_artifact, reference, tmp_path):
    server = Server(tp_artifact, tmp_path / "server.log", "--nproc", "2")
    try:
        ids = reference.tokenizer.encode(PROMPT)
        out = reference.generate([ids], max_new_tokens=12)
        tokens = out[0, len(ids):].tolist()
        response = server.client().completions.create(model="lm.dz", prompt=PROMPT,
                                                       max_tokens=12, temperature=0)
        assert response.choices[0].model_extra["token_ids"] == tokens
        assert response.choices[0].text == reference.tokenizer.decode(tokens)

        rank1 = _children(server.process.pid)
        assert len(rank1) == 1, rank1
        os.kill(rank1[0], signal.SIGKILL)
        start, statuses = time.monotonic(), []
        while server.process.poll() is None and time.monotonic() - start < 15:
            statuses.append(server.get("/health")[0])
            time.sleep(0.05)
        assert server.process.poll() is not None, "the server still runs 15 s after the kill"
        assert 503 in statuses
        log = server.log.read_text()
        assert server.process.returncode == 1, log
        assert "rank 1 was killed by SIGKILL" in log
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()


def test_a_rank_that_fails_to_load_is_named(tp_artifact, tmp_path):
    import shutil

    import torch.distributed

    import runtime
    from compiler.errors import DayzeroError

    broken = tmp_path / "broken.dz"
    shutil.copytree(tp_artifact, broken)
    shard = next((broken / "weights" / "rank-1").glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # same size: only rank 1, which hashes its own shards, can tell
    shard.write_bytes(bytes(data))
    with pytest.raises(DayzeroError, match=r"rank 1 failed: file weights/rank-1/\S+ does not "
                                           "match its sha256"):
        runtime.load(broken)
    assert not torch.distributed.is_initialized()  # the group was left: a new load may join


def test_nproc_must_match_the_artifact(tp_artifact, artifact, capsys):
    from compiler.cli import main

    assert main(["serve", str(tp_artifact), "--nproc", "3"]) != 0
    assert "tensor parallel over 2 ranks, but --nproc is 3" in capsys.readouterr().err
    assert main(["serve", str(artifact), "--nproc", "2"]) != 0
    assert "was not compiled tensor parallel" in capsys.readouterr().err


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found += [int(t) for t in text]
    return found
