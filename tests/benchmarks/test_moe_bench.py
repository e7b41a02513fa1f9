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


def test_the_deepseek_shape_counts_shared_experts_in_both(capsys):
    with benchmark_script("moe") as bench:
        assert bench.main(["--model", "deepseek_v3", "--hidden", "32", "--intermediate", "16",
                           "--experts", "8", "--top-k", "2", "--shared", "1", "--groups", "4",
                           "--layers", "1", "--heads", "2", "--vocab", "64", "--seq", "7",
                           "--rounds", "1"]) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    assert [int(r[0]) for r in rows] == [7]
    assert all(float(r[6]) < 1e-5 for r in rows)
    # routed: 2 chosen + 1 shared expert; dense: 8 + 1
    assert all(abs(float(r[4]) * 9 - float(r[5]) * 3) < 1e-2 for r in rows)
