"""Mutation fuzz of a real model's IR (issue 33), bounded and seeded: benchmarks/fuzz_ir.py's
mutations (byte flips, duplicated tokens, dims spliced between types, hostile size expressions
such as 16-argument Max in dims and attributes, duplicated or dropped lines) of the 1-layer
llama dump in fuzz_cases/. Every mutant ends in a verified graph or a DayzeroError, never a raw
exception, and costs at most twice the dump's work per KB, work counted as Python function
calls (cProfile) from a cold sympy cache: a count that does not vary with the machine's load.
`python benchmarks/fuzz_ir.py --cases N` runs the same fuzz long, on the 2-layer dump."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from benchmarks.fuzz_ir import mutate, parse_case

DUMP = Path(__file__).with_name("fuzz_cases") / "llama_1layer.dzir"
CASES = 300
SEED = 33
WORK_PER_KB = 2.0  # x the dump's calls per KB (observed worst: about 1.5)


@pytest.fixture(scope="module")
def dump() -> tuple[str, float]:
    """The dump's text and its calls per byte; the dump itself parses and verifies."""
    text = DUMP.read_text()
    parse_case(text)  # imports and lark's grammar, once
    outcome = parse_case(text, count=True)
    assert outcome.kind == "parsed", outcome.detail
    return text, outcome.calls / len(text)


def test_mutants_end_cleanly_within_a_counted_bound(dump):
    text, calls_per_byte = dump
    rng = random.Random(SEED)
    kinds, heavy, raw = {}, [], []
    for case in range(CASES):
        mutant, names = mutate(text, rng)
        outcome = parse_case(mutant, limit_s=20, count=True)
        kinds[outcome.kind] = kinds.get(outcome.kind, 0) + 1
        if outcome.kind in ("raw", "over-time"):
            raw.append((case, names, outcome.detail))
        ratio = outcome.calls / len(mutant) / calls_per_byte
        if ratio > WORK_PER_KB:
            heavy.append((case, names, round(ratio, 2), outcome.detail))
    assert not raw, raw
    assert not heavy, heavy
    assert kinds.get("parsed", 0) > 0 and kinds.get("parse-error", 0) > CASES // 2, kinds


def test_mutations_are_seeded():
    text = DUMP.read_text()
    first = [mutate(text, random.Random(7)) for _ in range(2)]
    assert first[0] == first[1]
    assert mutate(text, random.Random(8)) != first[0]
