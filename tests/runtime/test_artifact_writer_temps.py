"""A compile that is killed leaves no hidden temporary folder behind for long."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from compiler.writer import STALE_SECONDS, sweep_stale_temps, write_artifact

ROOT = Path(__file__).resolve().parents[2]

SLOW_WRITER = textwrap.dedent("""
    import sys, time
    from backends.reference import ReferenceBackend
    from compiler.writer import write_artifact
    sys.path.insert(0, sys.argv[2])
    from conftest import mlp_graph

    class Slow(ReferenceBackend):
        name = "reference"
        def lower(self, graph, weights, options):
            print("lowering", flush=True)
            time.sleep(60)
            return {}

    write_artifact(sys.argv[1], mlp_graph(), Slow())
""")


def hidden(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_sigterm_during_a_write_removes_the_temporary_folder(tmp_path):
    out = tmp_path / "m.dz"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(out),
                             str(Path(__file__).parent)], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "lowering"
        assert len(hidden(tmp_path)) == 1  # the temporary folder, while it writes
        assert f".m.dz.{proc.pid}-" in hidden(tmp_path)[0]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM  # it still ends as SIGTERM ends it
    finally:
        proc.kill()
    assert hidden(tmp_path) == [] and not out.exists()


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_next_write_sweeps_folders_of_killed_writers(tmp_path, make_mlp):
    dead = tmp_path / f".a.dz.{dead_pid()}-0123abcd.tmp"
    live = tmp_path / f".b.dz.{os.getpid()}-0123abcd.tmp"
    old = tmp_path / ".c.dz.89abcdef.tmp"  # no pid (an older dayzero): judged by its age
    young = tmp_path / ".d.dz.89abcdef.tmp"
    other = tmp_path / ".e.dz.dead-beef.tmp"  # not a name the writer makes
    for path in (dead, live, old, young, other):
        (path / "weights").mkdir(parents=True)
    past = time.time() - STALE_SECONDS - 60
    os.utime(old, (past, past))
    write_artifact(tmp_path / "m.dz", make_mlp(), "reference")
    assert hidden(tmp_path) == sorted([live.name, young.name, other.name])
    assert sweep_stale_temps(tmp_path) == []
