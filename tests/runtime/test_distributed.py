"""Partitioned artifacts on real ranks: gloo on CPU, started by torch.distributed's launcher.

Each launch starts several Python processes that import torch, so these tests share one set of
artifacts per module and launch as few times as the behaviours need: the Llama example under
tp=2 (through `dayzero run --nproc 2`), pp=2 and tp=2 x pp=2 (through `runtime.load`), each
against the eager model within 1e-5; a rank that dies or hangs, named by the others.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import runtime
from compiler.config import load_config
from compiler.driver import _backend, lower_and_write
from compiler.log import SILENT
from runtime.distributed import LaunchedModel, free_port
from tests.passes.parallel_util import llama_graph

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {"tp2": {"tensor_parallel": 2}, "pp2": {"pipeline_parallel": 2},
           "tp2pp2": {"tensor_parallel": 2, "pipeline_parallel": 2}}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """Artifacts of examples/llama.py for each config, the input ids and the eager logits."""
    root = tmp_path_factory.mktemp("parallel")
    paths = {}
    for name, parallel in CONFIGS.items():
        graph, ids, expected = llama_graph()
        paths[name] = lower_and_write(graph, root / f"{name}.dz", _backend("reference"),
                                      load_config({"parallel": parallel}), passes="",
                                      dump_ir=None, force=False, log=SILENT)
    ids_file = root / "input_ids.npy"
    np.save(ids_file, ids.numpy())
    return paths, ids.numpy(), expected.numpy(), ids_file


def _dayzero(*args, timeout=240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "compiler.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_cli_runs_tensor_parallel_on_two_ranks(llama, tmp_path):
    paths, _, expected, ids_file = llama
    out = tmp_path / "out.npz"
    result = _dayzero("run", paths["tp2"], "--nproc", "2", "--input", f"input_ids={ids_file}",
                      "--output", out)
    assert result.returncode == 0, result.stderr
    assert "out: float32[1, 8, 256]" in result.stdout
    with np.load(out) as data:
        np.testing.assert_allclose(data["out"], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["pp2", "tp2pp2"])
def test_runtime_load_launches_the_ranks(llama, name):
    paths, ids, expected, _ = llama
    model = runtime.load(paths[name])
    assert isinstance(model, LaunchedModel) and model.nproc == {"pp2": 2, "tp2pp2": 4}[name]
    assert [s.name for s in model.output_specs] == ["out"]
    (logits,) = model(ids)
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)


def test_cli_refuses_a_wrong_number_of_ranks(llama):
    paths, *_ = llama
    result = _dayzero("run", paths["tp2pp2"], "--nproc", "2")
    assert result.returncode == 1
    assert "partitioned for 4 ranks, but 2 were started" in result.stderr


def _worker(artifact, rank: int, world: int, port: int, inputs, timeout: float = 20):
    """One rank started the way torchrun starts it: the env of a torch.distributed launcher."""
    env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    return subprocess.Popen([sys.executable, "-m", "runtime.distributed", str(artifact),
                             "--inputs", str(inputs), "--timeout", str(timeout)],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_each_rank_checks_the_world_size(llama, tmp_path):
    paths, ids, _, _ = llama
    np.savez(tmp_path / "in.npz", input_ids=ids)
    rank = _worker(paths["tp2"], 0, 1, free_port(), tmp_path / "in.npz")
    _, err = rank.communicate(timeout=120)
    assert rank.returncode == 1
    assert "rank 0: the artifact is partitioned for 2 ranks, but 1 were started" in err


@pytest.fixture
def stalled_rank(llama, tmp_path):
    """Rank 0 runs; rank 1 blocks reading its inputs from a pipe, after joining the group."""
    paths, ids, _, _ = llama
    np.savez(tmp_path / "in.npz", input_ids=ids)
    fifo = tmp_path / "stall"
    os.mkfifo(fifo)
    port = free_port()

    def start(timeout):
        ranks = [_worker(paths["tp2"], 0, 2, port, tmp_path / "in.npz", timeout),
                 _worker(paths["tp2"], 1, 2, port, fifo, timeout)]
        writer = open(fifo, "wb")  # returns once rank 1 opened it: both passed the barrier
        started.append((ranks, writer))
        return ranks

    started: list = []
    yield start
    for ranks, writer in started:
        for rank in ranks:
            rank.kill()
            rank.communicate()
        writer.close()


def test_a_killed_rank_is_named_by_the_others(stalled_rank):
    rank0, rank1 = stalled_rank(timeout=60)
    rank1.send_signal(signal.SIGKILL)
    start = time.monotonic()
    _, err = rank0.communicate(timeout=50)
    assert rank0.returncode == 1
    assert "rank 0: rank 1 stopped responding" in err, err
    assert "all_reduce %embedding.ar" in err  # where rank 0 was waiting
    assert time.monotonic() - start < 40  # well before the 60 s collective timeout


def test_a_hung_rank_is_named_after_the_collective_timeout(stalled_rank):
    rank0, _ = stalled_rank(timeout=4)
    _, err = rank0.communicate(timeout=60)
    assert rank0.returncode == 1
    assert "rank 0: rank 1 did not take part in all_reduce within the collective timeout (4s)" \
        in err, err


def test_a_rank_that_fails_is_named_through_the_launcher(llama, tmp_path):
    paths, *_ = llama
    broken = tmp_path / "broken.dz"
    shutil.copytree(paths["tp2"], broken)
    shard = next((broken / "weights" / "rank-1").glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-4] ^= 0xFF  # a weight byte, not the header: only rank 1's own check can see it
    shard.write_bytes(bytes(data))
    result = _dayzero("run", broken, "--nproc", "2", "--timeout", "30")
    assert result.returncode == 1
    assert "error: rank 1 failed: file weights/rank-1/" in result.stderr
    assert "does not match its sha256" in result.stderr
    assert "rank(s) 0 were stopped by the launcher" in result.stderr or \
        "rank 0: rank 1 failed" in result.stderr
