"""The local launcher: who is blamed when ranks fail, what a killed launch leaves behind, and
the collective timeout given to runtime.load."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import runtime
import runtime.distributed as dist_runtime
from compiler.errors import DayzeroError
from runtime.distributed import RUN_DIR_PURPOSE, _launch_error, sweep_run_dirs
from runtime.stale_dirs import MARKER, mark, read_marker

ROOT = Path(__file__).resolve().parents[2]


def failure(exitcode, message="", when=100.0):
    data = {"message": message, "timestamp": int(when), "dayzero_time": when} if message else {}
    return SimpleNamespace(exitcode=exitcode, message=message, timestamp=int(when),
                           error_file_data=data)


def test_a_killed_rank_is_blamed_not_the_rank_the_launcher_stopped():
    """Rank 1 is SIGKILLed; the launcher then stops rank 0 with SIGTERM."""
    error = _launch_error(SimpleNamespace(failures={0: failure(-signal.SIGTERM),
                                                    1: failure(-signal.SIGKILL)}))
    assert error.what == ("rank 1 was killed by SIGKILL; rank(s) 0 were stopped by the "
                          "launcher")
    assert error.where == "rank 1" and "why rank 1 died" in error.fix


def test_a_killed_rank_is_blamed_not_the_peer_that_noticed_it():
    error = _launch_error(SimpleNamespace(failures={
        0: failure(1, "rank 0: rank 1 stopped responding (no heartbeat for 3s)", when=103.2),
        1: failure(-signal.SIGKILL)}))
    assert error.what == "rank 1 was killed by SIGKILL; rank(s) 0 failed after that"
    assert error.where == "rank 1"


def test_the_rank_that_failed_first_is_blamed():
    error = _launch_error(SimpleNamespace(failures={
        0: failure(1, "rank 0: rank 1 failed: bad weights", when=104.9),
        1: failure(1, "rank 1: bad weights", when=101.5),
        2: failure(-signal.SIGTERM)}))
    assert error.what == ("rank 1 failed: bad weights; rank(s) 0 failed after that; rank(s) 2 "
                          "were stopped by the launcher")
    assert error.where == "rank 1" and error.fix.startswith("fix what rank 1 reports")


def test_ranks_failing_together_are_all_named():
    error = _launch_error(SimpleNamespace(failures={0: failure(1, "rank 0: x", when=10.1),
                                                    1: failure(1, "rank 1: x", when=10.4)}))
    assert error.what == "rank 0 failed: x; rank 1 failed: x" and error.where == "ranks 0, 1"


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_run_folders_of_dead_launchers_are_swept(tmp_path):
    """Only marked folders whose launcher is gone; an unmarked one is not ours, however old
    (more cases in test_temp_folders.py)."""
    pid = dead_pid()
    dead = tmp_path / f"dayzero-run-{pid}-abc123"
    live = tmp_path / f"dayzero-run-{os.getpid()}-abc123"
    old = tmp_path / f"dayzero-run-{pid}-k2j3h4"
    for path in (dead, live, old):
        path.mkdir()
    mark(live, RUN_DIR_PURPOSE)
    (dead / MARKER).write_text(json.dumps({**read_marker(live), "pid": pid, "start": None}))
    os.utime(old, (time.time() - 7200,) * 2)
    assert sweep_run_dirs(tmp_path) == [dead]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, old.name])


def fake_partitioned(tmp_path) -> Path:
    """A manifest-only two-rank artifact: enough to reach the process group's initialisation."""
    out = tmp_path / "p.dz"
    out.mkdir()
    ranks = [{"rank": r, "graph": "graph.dzir", "weights": []} for r in (0, 1)]
    graph = b"graph g() {\n}\n"
    (out / "graph.dzir").write_bytes(graph)
    listed = {"graph.dzir": {"size": len(graph), "sha256": hashlib.sha256(graph).hexdigest()}}
    (out / "manifest.json").write_text(json.dumps({
        "format": "dayzero-artifact", "format_version": 1, "backend": "reference",
        "graph": "graph.dzir", "inputs": [], "outputs": [], "symbols": {}, "files": listed,
        "parallel": {"world_size": 2, "ranks": ranks}}))
    return out


@pytest.mark.parametrize("timeout, expected", [(None, 300.0), (12, 12.0), (0.5, 0.5)])
def test_runtime_load_timeout_reaches_the_process_group(tmp_path, monkeypatch, timeout,
                                                        expected):
    seen = []

    def connect(env, groups, timeout):
        seen.append(timeout)
        raise RuntimeError("stop here")

    monkeypatch.setattr(dist_runtime, "connect", connect)
    for key, value in dict(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT="1").items():
        monkeypatch.setenv(key, value)
    with pytest.raises(RuntimeError, match="stop here"):
        runtime.load(fake_partitioned(tmp_path), timeout=timeout)
    assert seen == [expected]


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), "60", True])
def test_a_bad_timeout_is_refused(tmp_path, monkeypatch, timeout):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(DayzeroError, match="is not a positive number of seconds"):
        runtime.load(fake_partitioned(tmp_path), timeout=timeout)


# -- a launcher that is stopped or killed: its ranks go with it, its folders are removed --------

SLEEPER = textwrap.dedent("""
    import os, time
    from runtime.distributed import _die_with_parent
    _die_with_parent()
    with open(os.path.join(os.environ["PIDS"], os.environ["RANK"]), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(120)
""")

LAUNCHER = textwrap.dedent("""
    import numpy as np
    import runtime.distributed as d
    from compiler.errors import DayzeroError
    d.WORKER = "sleeper"
    try:
        d.launch("unused.dz", 2, {"x": np.zeros(2)}, timeout=30)
    except DayzeroError as exc:
        print(f"{exc.what} | {exc.where}", flush=True)
        raise SystemExit(1)
""")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone too
        return f.read().split(")")[-1].split()[0] != "Z"


@pytest.fixture
def launched(tmp_path):
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    tmp, pids = tmp_path / "tmp", tmp_path / "pids"
    tmp.mkdir()
    pids.mkdir()
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}", TMPDIR=str(tmp),
               PIDS=str(pids))
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while len(list(pids.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)  # the pid files are written: each rank has asked to die with its parent
    by_rank = {int(p.name): int(p.read_text()) for p in pids.iterdir()}
    ranks = [by_rank[r] for r in sorted(by_rank)]
    yield proc, ranks, tmp
    proc.kill()
    for pid in ranks:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def wait_gone(pids, seconds=15.0) -> bool:
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(alive(p) for p in pids)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_sigterm_to_the_launcher_stops_the_ranks_and_removes_its_folders(launched):
    proc, ranks, tmp = launched
    assert len(ranks) == 2
    assert [p.name.startswith(f"dayzero-run-{proc.pid}-") for p in tmp.iterdir()] == [True]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    assert wait_gone(ranks)
    assert list(tmp.iterdir()) == []  # no dayzero-run-*, no torchelastic_*


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_launcher_takes_its_ranks_along_and_the_next_launch_sweeps(launched):
    proc, ranks, tmp = launched
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    start = time.monotonic()
    assert wait_gone(ranks)
    assert time.monotonic() - start < 5  # not after their collective timeout
    left = list(tmp.iterdir())
    assert [p.name.startswith(f"dayzero-run-{proc.pid}-") for p in left] == [True]
    assert sweep_run_dirs(tmp) == left and list(tmp.iterdir()) == []


def test_a_rank_killed_during_a_launch_is_the_one_blamed(launched):
    proc, ranks, tmp = launched
    os.kill(ranks[1], signal.SIGKILL)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert out.strip() == ("rank 1 was killed by SIGKILL; rank(s) 0 were stopped by the "
                           "launcher | rank 1")
    assert wait_gone(ranks) and list(tmp.iterdir()) == []
