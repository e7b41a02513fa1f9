"""`dayzero bench`: warm runs, median and p90, inputs generated or given."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from compiler.cli import main
from compiler.commands.bench import bench

ROOT = Path(__file__).resolve().parents[2]
TINY = f"{ROOT}/tests/tools/tiny_model.py:build"


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "tiny.dz"
    assert main(["compile", TINY, "-o", str(out)]) == 0
    return out


def test_json_result_with_generated_inputs(artifact, capsys):
    assert main(["bench", str(artifact), "--runs", "7", "--warmup", "2", "--size", "s0=11",
                 "--json"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)  # stdout holds the JSON only
    assert "inputs: generated x[2, 11, 8]" in captured.err
    assert result["backend"] == "onnxruntime" and result["inputs"] == {"x": [2, 11, 8]}
    assert (result["runs"], result["warmup"]) == (7, 2)
    assert 0 < result["min_ms"] <= result["median_ms"] <= result["p90_ms"]


def test_text_result_with_given_inputs(artifact, tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros((2, 3, 8), np.float32))
    assert main(["bench", str(artifact), "--input", f"x={tmp_path / 'x.npy'}",
                 "--runs", "3"]) == 0
    out = capsys.readouterr().out
    assert "inputs x[2, 3, 8]: 5 warm-up + 3 runs" in out
    assert "median" in out and "p90" in out


def test_session_settings_for_these_runs(artifact, capsys):
    assert main(["bench", str(artifact), "--runs", "2", "--session", "intra_op_threads=1",
                 "--session", "allow_spinning=false"]) == 0
    out = capsys.readouterr().out
    assert "intra_op_threads=1" in out and "allow_spinning=false" in out
    assert main(["bench", str(artifact), "--session", "threads=1"]) == 1
    assert "session.threads" in capsys.readouterr().err


def test_bad_counts_are_refused(artifact, capsys):
    assert main(["bench", str(artifact), "--runs", "0"]) == 1
    assert "need runs >= 1" in capsys.readouterr().err


def test_bench_counts_calls():
    calls = []

    class Model:
        input_specs = []

        def __call__(self, *inputs):
            calls.append(inputs)

    result = bench(Model(), [], warmup=3, runs=4, name="m")
    assert len(calls) == 7 and result.runs == 4 and result.backend == "unknown"
