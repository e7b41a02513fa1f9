"""benchmarks/moe.py compiles its Mixtral-shaped model, runs both sides and they agree (its
timings are not checked: they belong to the machine)."""

from __future__ import annotations

from tests.benchmarks.scripts import benchmark_script


def test_the_moe_benchmark_runs_and_agrees(capsys):
    with benchmark_script("moe") as bench:
        assert bench.main(["--hidden", "32", "--intermediate", "48", "--experts", "4",
                           "--layers", "1", "--heads", "4", "--vocab", "64", "--seq", "5", "9",
                           "--rounds", "1"]) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    assert [int(r[0]) for r in rows] == [5, 9]
    assert all(float(r[6]) < 1e-5 for r in rows)
    # routed FLOPs are top_k / experts of the dense ones
    assert all(abs(float(r[4]) * 2 - float(r[5])) < 1e-2 for r in rows)
