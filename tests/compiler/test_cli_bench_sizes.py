"""`dayzero bench ARTIFACT --sizes ... [--plot]`: latency against a size symbol."""

from __future__ import annotations

import json

import pytest

from compiler.cli import main


def test_sizes_bench_each_size_with_generated_inputs(mlp_artifact, capsys):
    assert main(["bench", str(mlp_artifact), "--sizes", "1,4,16", "--runs", "2",
                 "--warmup", "0"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    rows = [line for line in lines if line.lstrip().startswith("s0=")]
    assert [r.split()[0] for r in rows] == ["s0=1", "s0=4", "s0=16"]
    assert "input[1, 32]" in rows[0] and "input[16, 32]" in rows[2]


def test_sizes_by_dim_name_as_json(mlp_artifact, capsys):
    assert main(["bench", str(mlp_artifact), "--sizes", "batch=2,8", "--runs", "1",
                 "--warmup", "0", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["size"], r["inputs"]["input"]) for r in rows] == [(2, [2, 32]), (8, [8, 32])]
    assert all(r["median_ms"] > 0 and r["runs"] == 1 for r in rows)


def test_plot_draws_latency_against_size(mlp_artifact, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "latency.png"
    assert main(["bench", str(mlp_artifact), "--sizes", "1,8", "--runs", "1", "--warmup", "0",
                 "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {out}" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--plot", "x.png"], "it needs --sizes"),
    (["--sizes", "a,b"], "is not a comma-separated list of sizes"),
    (["--sizes", "4", "--input", "input=x.npy"], "drop --input"),
    (["--sizes", "2000000"], "2000000"),
    (["--sizes", "nosuch=4"], "nosuch"),
])
def test_bad_sizes_are_named(mlp_artifact, capsys, argv, message):
    assert main(["bench", str(mlp_artifact), "--runs", "1", "--warmup", "0", *argv]) != 0
    assert message in capsys.readouterr().err
