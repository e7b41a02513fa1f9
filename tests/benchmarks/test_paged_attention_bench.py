"""benchmarks/paged_attention.py runs the native kernel and torch's sdpa on the same steps and
they agree (its timings are not checked: they belong to the machine)."""

from __future__ import annotations

from tests.benchmarks.scripts import benchmark_script


def test_prefill_and_decode_run_and_agree_with_sdpa(capsys):
    with benchmark_script("paged_attention") as bench:  # raises if the outputs disagree
        assert bench.main(["--chunk", "9", "--cached", "40", "--decode", "600",
                           "--sequences", "1,5", "--rounds", "1", "--calls", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[0] for line in lines[1:]] == [
        "prefill 9 after 40", "decode x1 after 600", "decode x5 after 600"]
    assert "floor" in lines[2] and "floor" in lines[3] and "floor" not in lines[1]
