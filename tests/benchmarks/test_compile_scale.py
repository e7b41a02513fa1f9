"""benchmarks/compile_scale.py's bookkeeping (not its timings): the ratio against linear, the
verdicts, the small-stage and torch exemptions, and one real compile at 2 layers."""

from __future__ import annotations

import pytest

from tests.benchmarks.scripts import benchmark_script


@pytest.fixture(scope="module")
def scale():
    with benchmark_script("compile_scale") as module:
        yield module


def test_linear_stages_pass_and_quadratic_ones_fail(scale, capsys):
    results = {32: (1000, {"torch.export": 1.0, "pass fuse": 1.0, "pass quad": 1.0,
                           "pass tiny": 0.001}),
               128: (4000, {"torch.export": 16.0, "pass fuse": 4.4, "pass quad": 16.0,
                            "pass tiny": 0.016})}
    assert scale.report(results) is False
    lines = {line.split()[0] + " " + line.split()[1]: line for line in
             capsys.readouterr().out.splitlines() if line.startswith(("pass", "torch"))}
    assert lines["pass fuse"].split()[-2:] == ["1.10", "PASS"]
    assert lines["pass quad"].split()[-2:] == ["4.00", "FAIL"]
    assert lines["pass tiny"].endswith("PASS (small)")  # 16 ms: noise, not judged
    assert lines["torch.export 1.000"].endswith("(torch)")  # not dayzero's own work


def test_the_total_is_judged_without_torch(scale, capsys):
    results = {8: (100, {"torch.export": 1.0, "pass fuse": 1.0}),
               32: (400, {"torch.export": 40.0, "pass fuse": 4.0})}
    assert scale.report(results) is True
    total = next(line for line in capsys.readouterr().out.splitlines()
                 if line.startswith("dayzero total"))
    assert total.split()[-2:] == ["1.00", "PASS"]


def test_one_compile_times_every_stage(scale, tmp_path):
    nodes, times = scale.compile_once(2, tmp_path / "llama2.dz")
    assert nodes > 100
    assert {"torch.export", "convert to IR", "pass fuse", "verify+print (manager)",
            "lower (onnxruntime)", "write artifact"} <= set(times)
    assert all(t >= 0 for t in times.values())
    assert (tmp_path / "llama2.dz" / "manifest.json").exists()
