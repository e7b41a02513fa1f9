"""Corrupted artifacts (benchmarks/fuzz_artifacts.py, seeded and bounded): every load of a
mutated forward or generation artifact gives the pristine's output or a clean DayzeroError; no
raw exception, no crash, no hang, no manifest edit that silently changes the output.
`python benchmarks/fuzz.py --cases N` runs the same fuzz long."""

from __future__ import annotations

import random

import pytest

from tests.benchmarks.scripts import benchmark_script

CASES = 300  # about 10 s on a quiet 2-core machine, most of it the two compiles


@pytest.fixture(scope="module")
def fuzz():
    with benchmark_script("fuzz_artifacts") as module:
        yield module


def test_corrupted_artifacts_end_in_clean_errors(fuzz, tmp_path):
    lines: list[str] = []
    report = fuzz.run(CASES, seed=20261203, work=tmp_path, deadline=60.0, log=lines.append)
    assert report.ok, "\n".join(lines)
    # the mutations reach past the hash check: loads that succeed and loads that are refused
    assert report.counts["same"] > CASES // 10 and report.counts["error"] > CASES // 10


def test_the_worker_counts_a_crash_and_a_hang(fuzz, tmp_path):
    """The harness itself: a case that kills the worker is a crash, one that never answers a
    hang, and the worker comes back for the next case."""
    pristine = fuzz.build_pristine(tmp_path / "pristine")
    worker = fuzz.Worker(pristine, deadline=5.0)
    try:
        case = fuzz.make_case(random.Random(0), pristine, tmp_path, 0)
        assert worker.ask(case)["outcome"] in {"same", "error", "changed"}
        worker.proc.kill()
        worker.proc.wait()
        assert worker.ask(case)["outcome"] in {"same", "error", "changed"}  # restarted
        worker.proc.send_signal(19)  # SIGSTOP: the worker never answers
        assert worker.ask(case)["outcome"] == "hang"
        assert worker.ask(case)["outcome"] in {"same", "error", "changed"}
    finally:
        worker.close()


def test_classify_treats_a_changed_output_from_the_manifest_as_suspect(fuzz, tmp_path):
    case = fuzz.Case("forward", tmp_path, "manifest.json", "x", rehashed=False, semantic=False)
    assert fuzz.classify(case, {"outcome": "changed"}) == "suspect"
    weights = fuzz.Case("forward", tmp_path, "weights/a.safetensors", "x", True, True)
    assert fuzz.classify(weights, {"outcome": "changed"}) == "changed"
