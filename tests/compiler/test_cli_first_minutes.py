"""The `dayzero` command line as a new user meets it (issue 16): flags, pipes, --size names,
verdicts, input files, output locations, and what compile says it did."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from compiler.cli import main

ROOT = Path(__file__).resolve().parents[2]
MLP = f"{ROOT}/examples/mlp.py:build"


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """examples/mlp.py on the reference backend: input `input` f32[s0, 32], s0 = Dim batch."""
    out = tmp_path_factory.mktemp("first") / "mlp.dz"
    assert main(["compile", MLP, "-o", str(out), "--backend", "reference"]) == 0
    return out


def _spec_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "spec.py"
    path.write_text("import torch\n" + body)
    return path


# -- flags -------------------------------------------------------------------------------------

def test_version_prints_the_package_version(capsys):
    import importlib.metadata

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"dayzero {importlib.metadata.version('dayzero')}"


def test_debug_works_after_the_subcommand(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "missing.dz"), "--debug"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "does not exist" in err
    assert main(["--debug", "inspect", str(tmp_path / "missing.dz")]) == 1
    assert "Traceback" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "missing.dz")]) == 1
    assert "Traceback" not in capsys.readouterr().err


def test_output_into_a_closed_pipe_ends_quietly(tmp_path):
    """`dayzero inspect m.dzir | head`: no 'internal error: BrokenPipeError'; 141 as `cat`."""
    lines = [f"  %v{i}: f32[2] = relu(%v{i - 1})" for i in range(1, 200)]
    (tmp_path / "m.dzir").write_text("graph main {\n  input %v0: f32[2]\n" + "\n".join(lines)
                                     + "\n  return %v199\n}\n")
    proc = subprocess.Popen([sys.executable, "-m", "compiler.cli", "inspect",
                             str(tmp_path / "m.dzir")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT)
    proc.stdout.close()  # the reader has gone before the first line (`| true`): always EPIPE
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert err == ""


# -- inspect reads only what the manifest lists and the loader checked -------------------------

def test_inspect_does_not_follow_the_manifest_out_of_the_artifact(mlp, tmp_path, capsys):
    import shutil

    bad = tmp_path / "bad.dz"
    shutil.copytree(mlp, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["parallel"]["world_size"] = 2  # take inspect's partitioned-artifact path
    for target in ("/etc/passwd", "../../outside.dzir", "unlisted.dzir"):
        manifest["graph"] = target
        (bad / "manifest.json").write_text(json.dumps(manifest))
        assert main(["inspect", str(bad)]) == 1
        err = capsys.readouterr().err
        assert "root:" not in err and "internal error" not in err
        assert "not a plain relative path" in err or "not listed in manifest.json" in err
