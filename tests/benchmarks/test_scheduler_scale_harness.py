"""benchmarks/scheduler_scale.py's bookkeeping (not its timings): the verdict against 1.5x
linear, the seeded prompts, and one real run at small N on the artifact it compiles once."""

from __future__ import annotations

import pytest

from tests.benchmarks.scripts import benchmark_script


@pytest.fixture(scope="module")
def bench():
    with benchmark_script("scheduler_scale") as module:
        yield module


def test_linear_passes_and_quadratic_fails(bench, capsys):
    # judged on CPU time (the first of each pair); wall time is shown
    assert bench.report({10_000: (1.0, 5.0), 100_000: (12.0, 100.0)}) is True
    assert capsys.readouterr().out.splitlines()[-1] == (
        "time ratio 100000/10000: 12.00x for 10x the prompts (target <= 15.0x): PASS")
    assert bench.report({1_000: (0.1, 0.1), 10_000: (1.0, 1.0), 100_000: (100.0, 1.0)}) is False
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["1000", "prompts:", "0.100", "s", "CPU"]
    assert lines[-1].endswith("100.00x for 10x the prompts (target <= 15.0x): FAIL")


def test_prompts_are_seeded_and_short(bench):
    first = bench.prompts(500)
    assert len(first) == 500 and {len(p) for p in first} == {2, 3, 4, 5, 6}
    assert all((p >= 3).all() and (p < 256).all() for p in first)
    assert all((a == b).all() for a, b in zip(first, bench.prompts(500)))


def test_a_small_run_times_each_size_and_reuses_the_artifact(bench, tmp_path, capsys):
    code = bench.main(["--sizes", "20,200", "--repeat", "1", "--workdir", str(tmp_path)])
    out = capsys.readouterr().out.splitlines()
    assert code in (0, 1)  # timings at this size are noise; the lines are what is checked
    assert [line.split()[0] for line in out[:2]] == ["20", "200"]
    assert out[-1].startswith("time ratio 200/20: ")
    manifest = tmp_path / "llama_scale.dz" / "manifest.json"
    stamp = manifest.stat().st_mtime_ns
    assert bench.build(tmp_path) == tmp_path / "llama_scale.dz"
    assert manifest.stat().st_mtime_ns == stamp  # compiled once
