"""benchmarks/batch_steps.py's bookkeeping (not its timings): the step report's split of
decode-only steps by size and of the steps that carried prompt tokens."""

from __future__ import annotations

import pytest

from tests.benchmarks.scripts import benchmark_script


@pytest.fixture(scope="module")
def bench():
    with benchmark_script("batch_steps") as module:
        yield module


def test_the_report_splits_decode_steps_by_size_from_prompt_steps(bench):
    steps = [bench.Step(0.020, 8, 8), bench.Step(0.022, 8, 8), bench.Step(0.030, 8, 8),
             bench.Step(0.010, 1, 1), bench.Step(0.500, 519, 8)]
    lines = bench.step_report("c=8", steps, generated=33, wall=1.1)
    assert lines[0] == "c=8: 33 tokens in 1.1 s = 30.0 tok/s; 5 steps"
    assert lines[1] == "  decode-only steps by sequences: 1: 1 x 10.0 ms, 8: 3 x 22.0 ms"
    assert lines[2] == "  steps with prompt tokens: 1, 0.5 s, 511 prompt tokens"


def test_a_run_without_decode_only_steps_says_so(bench):
    lines = bench.step_report("c=1", [bench.Step(0.1, 64, 1)], generated=1, wall=0.1)
    assert lines[1] == "  decode-only steps by sequences: none"
