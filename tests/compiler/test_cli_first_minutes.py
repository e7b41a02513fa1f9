"""The `dayzero` command line as a new user meets it (issue 16): flags, pipes, --size names,
verdicts, input files, output locations, and what compile says it did."""

from __future__ import annotations

import errno
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from compiler.cli import main

ROOT = Path(__file__).resolve().parents[2]
MLP = f"{ROOT}/examples/mlp.py:build"


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


def test_version_without_an_installed_package_reads_pyproject(monkeypatch):
    import importlib.metadata

    from compiler.cli import version

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    declared = re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version() == f"{declared.group(1)} (source tree, not installed)"


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


def test_a_broken_pipe_that_is_not_stdout_stays_an_error():
    """A BrokenPipeError from a socket or a child's pipe is a failure, not a reader gone."""
    script = ("import sys\n"
              "from compiler import cli\n"
              "from compiler.commands import backends\n"
              "def broken(args):\n"
              "    raise BrokenPipeError(32, 'Broken pipe')\n"
              "backends.backends_command = broken\n"
              "sys.exit(cli.main(['backends']))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=ROOT, timeout=60)
    assert result.returncode == 1
    assert "internal error: BrokenPipeError" in result.stderr


def test_compile_help_lists_passes_and_default_pipelines(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["compile", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--dump-ir" in out
    for name in ("fold_constants", "fuse", "quantize_weights", "plan_memory"):
        assert f"  {name}: " in out
    assert "  onnxruntime: remove_noops," in out and "partitioned (parallel:" in out


# -- run: --size, --check, --input, --output ---------------------------------------------------

def test_size_takes_the_dim_name_or_the_symbol(mlp_artifact, capsys):
    manifest = json.loads((mlp_artifact / "manifest.json").read_text())
    assert manifest["symbol_aliases"] == {"batch": "s0"}
    assert main(["run", str(mlp_artifact), "--size", "batch=3"]) == 0
    assert "inputs: generated input[3, 32]" in capsys.readouterr().out
    assert main(["run", str(mlp_artifact), "--size", "s0=5"]) == 0
    assert "inputs: generated input[5, 32]" in capsys.readouterr().out


def test_inspect_lists_the_size_symbols_and_their_dim_names(mlp_artifact, capsys):
    assert main(["inspect", str(mlp_artifact)]) == 0
    assert "# size symbols (dayzero run --size NAME=N): s0 (batch) in [1, 1024]\n" in \
        capsys.readouterr().out


def test_size_with_an_unknown_name_lists_the_known_ones(mlp_artifact, capsys):
    assert main(["run", str(mlp_artifact), "--size", "seq=300"]) == 1
    err = capsys.readouterr().err
    assert "no size symbol 'seq'" in err and "its symbols are s0 (batch)" in err


def test_size_outside_its_range_names_symbol_and_range(mlp_artifact, capsys):
    assert main(["run", str(mlp_artifact), "--size", "batch=99999999999999999999"]) == 1
    err = capsys.readouterr().err
    assert "outside the range of s0 (batch), [1, 1024]" in err and "internal error" not in err


def test_huge_size_of_an_unbounded_symbol_is_refused(tmp_path, capsys):
    spec = _spec_file(tmp_path, "def build():\n"
                      "    n = torch.export.Dim('n', min=2)\n"
                      "    return torch.nn.ReLU(), (torch.ones(4, 3),), ({0: n},)\n")
    out = tmp_path / "relu.dz"
    assert main(["compile", f"{spec}:build", "-o", str(out), "--backend", "reference"]) == 0
    capsys.readouterr()
    assert main(["run", str(out), "--size", f"n={10**15}"]) == 1
    err = capsys.readouterr().err
    assert "would take" in err and "GiB" in err and "internal error" not in err


def test_check_says_whether_outputs_match_eager(mlp_artifact, tmp_path, capsys):
    assert main(["run", str(mlp_artifact), "--check", MLP]) == 0
    out = capsys.readouterr().out
    assert "matches PyTorch eager within" in out and "1e-5 x max(1, max|eager|)" in out
    assert "outputs discarded (--output FILE.npz keeps them)" in out
    other = _spec_file(tmp_path, f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
                       "from examples import mlp\n"
                       "def build():\n"
                       "    model, inputs, dyn = mlp.build()\n"
                       "    with torch.no_grad():\n"
                       "        model[0].bias.add_(1.0)\n"
                       "    return model, inputs, dyn\n")
    assert main(["run", str(mlp_artifact), "--check", f"{other}:build"]) == 1
    err = capsys.readouterr().err
    assert "output out differs from PyTorch eager: max abs error" in err


def test_input_from_npz_by_name_or_only_array(mlp_artifact, tmp_path, capsys):
    x = np.random.default_rng(0).standard_normal((2, 32)).astype(np.float32)
    np.savez(tmp_path / "one.npz", anything=x)
    np.savez(tmp_path / "named.npz", input=x, other=x[:1])
    np.savez(tmp_path / "two.npz", a=x, b=x)
    for file in ("one.npz", "named.npz"):
        assert main(["run", str(mlp_artifact), "--input", f"input={tmp_path / file}"]) == 0
        assert "out: float32[2, 16]" in capsys.readouterr().out
    assert main(["run", str(mlp_artifact), "--input", f"input={tmp_path / 'two.npz'}"]) == 1
    err = capsys.readouterr().err
    assert "holds several arrays (a, b) and none is called 'input'" in err
    assert "<U" not in err


def test_run_output_to_a_bad_place_is_a_user_error(mlp_artifact, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert main(["run", str(mlp_artifact), "--output", str(tmp_path / "file" / "out.npz")]) == 1
    err = capsys.readouterr().err
    assert "cannot write" in err and "internal error" not in err


def test_spec_tuple_of_the_wrong_length(tmp_path, capsys):
    spec = _spec_file(tmp_path, "def build():\n"
                      "    return torch.nn.ReLU(), (torch.ones(2),), None, 'extra'\n")
    assert main(["compile", f"{spec}:build", "-o", str(tmp_path / "x.dz")]) == 1
    err = capsys.readouterr().err
    assert "returned a tuple of 4 item(s), not 2 or 3" in err and "not a tuple" not in err


# -- compile: where it writes, and what it did -------------------------------------------------

@pytest.mark.parametrize("where, message", [
    ("file/m.dz", "is a file, not a folder"),
    ("file/deeper/m.dz", "is a file, not a folder"),
    ("/proc/m.dz", "making a folder in /proc fails"),
])
def test_bad_output_location_is_refused_before_export(where, message, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    out = where if where.startswith("/") else str(tmp_path / where)
    assert main(["compile", MLP, "-o", out, "--backend", "reference"]) == 1
    err = capsys.readouterr().err
    assert message in err and "internal error" not in err
    assert "[load]" not in err and "[export]" not in err  # nothing ran first


def test_dump_ir_into_a_file_is_refused_before_export(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert main(["compile", MLP, "-o", str(tmp_path / "m.dz"), "--backend", "reference",
                 "--dump-ir", str(tmp_path / "file")]) == 1
    err = capsys.readouterr().err
    assert "--dump-ir folder" in err and "[export]" not in err


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EFBIG])
def test_write_errors_name_the_path_and_the_reason(code, tmp_path, capsys, monkeypatch):
    import os

    import compiler.writer.artifact_writer as writer

    def full(root, rel, data, files):
        raise OSError(code, os.strerror(code), str(root / rel))

    monkeypatch.setattr(writer, "put_file", full)
    out = tmp_path / "m.dz"
    assert main(["compile", MLP, "-o", str(out), "--backend", "reference"]) == 1
    err = capsys.readouterr().err
    assert f"writing {out} failed: {os.strerror(code)}" in err and "internal error" not in err
    assert "graph.dzir" in err  # where: the file being written
    assert not out.exists() and not list(tmp_path.glob(".m.dz*"))


def test_compile_says_what_quantization_covered(tmp_path, capsys):
    (tmp_path / "q.yaml").write_text("quantize: {weights: int4, group_size: 64}\n")
    assert main(["compile", MLP, "-o", str(tmp_path / "q.dz"), "--backend", "reference",
                 "--config", str(tmp_path / "q.yaml")]) == 0
    err = capsys.readouterr().err
    assert "quantize_weights: 2 of 3 linear layers to int4 (group_size 64); left in float: " \
           "1 (in-features 32 not a multiple of group_size 64)" in err
    assert "(quantize.group_size 32 would quantize 1 of those as well" in err


# -- inspect reads only what the manifest lists and the loader checked -------------------------

def test_inspect_does_not_follow_the_manifest_out_of_the_artifact(mlp_artifact, tmp_path, capsys):
    import shutil

    bad = tmp_path / "bad.dz"
    shutil.copytree(mlp_artifact, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["parallel"]["world_size"] = 2  # take inspect's partitioned-artifact path
    for target in ("/etc/passwd", "../../outside.dzir", "unlisted.dzir"):
        manifest["graph"] = target
        (bad / "manifest.json").write_text(json.dumps(manifest))
        assert main(["inspect", str(bad)]) == 1
        err = capsys.readouterr().err
        assert "root:" not in err and "internal error" not in err
        assert "not a plain relative path" in err or "not listed in manifest.json" in err


# -- a tensor-parallel artifact: what compile skipped, run's timing, bench -----------------------

@pytest.mark.slow  # one launch of two rank processes (~10 s on 2 cores)
def test_tensor_parallel_compile_run_and_bench(tmp_path, capsys):
    (tmp_path / "tp.yaml").write_text("parallel: {tensor_parallel: 2}\n")
    out = tmp_path / "tp.dz"
    assert main(["compile", MLP, "-o", str(out), "--config", str(tmp_path / "tp.yaml")]) == 0
    err = capsys.readouterr().err
    assert "note: fuse skipped: a partitioned compile (parallel: tensor_parallel 2)" in err
    assert main(["bench", str(out)]) == 1  # was: 'LaunchedModel' object has no attribute
    err = capsys.readouterr().err
    assert "partitioned for 2 ranks" in err and "torchrun --nproc-per-node 2" in err
    result = subprocess.run([sys.executable, "-m", "compiler.cli", "run", str(out), "--size",
                             "batch=3"], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert re.search(r"ran in [\d.]+ ms on 2 ranks; starting and loading the ranks took "
                     r"[\d.]+ ms more", result.stdout), result.stdout
