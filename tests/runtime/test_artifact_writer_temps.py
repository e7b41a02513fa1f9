"""A compile that is killed leaves no hidden temporary folder behind for long (the sweep of
folders left by killed writers is tested in test_temp_folders.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

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
