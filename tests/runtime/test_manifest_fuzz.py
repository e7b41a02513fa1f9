"""A seeded mini-fuzz of manifest.json (issue 33): 200 mutations of a real ONNX Runtime
artifact's manifest (type swaps, huge and negative numbers, deletions, deep nesting, long
strings, lone surrogates, duplicate keys, cut-off text). Only manifest.json changes, so every
other file's hash stays valid. Every outcome is a DayzeroError at load (or at the first call),
or a model that gives exactly the pristine artifact's outputs: never another exception, never
a hang, never a different answer."""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path

import numpy as np
import pytest

import runtime
from compiler.errors import DayzeroError
from compiler.writer import write_artifact
from tests.runtime.test_artifact_consistency import IDS, vocab_graph

CASES = 200
SECONDS = 10  # per case; a load takes tens of milliseconds
BUDGET = 60   # the whole run

# JSON text that json.dumps cannot write, swapped in for these placeholders
RAW = {"<BIG>": "9" * 90, "<HUGE>": "9" * 5000, "<DEEP>": "[" * 5000 + "]" * 5000,
       "<SURROGATE>": '"\\ud800"', "<NAN>": "NaN"}
VALUES = [None, True, False, 0, 1, -1, -256, 2**31, 2**63, 2**64, 1.5, -0.0, "", "s0", "s0 + 1",
          "f32", "i64", "../x", "/etc/passwd", "a" * 1800, "x" * 100000, [], [1], [None], {},
          {"a": 1}, [[1]], *RAW]


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            yield from _paths(inner, (*prefix, i))


def _mutate(manifest: dict, rng: random.Random) -> dict:
    path = rng.choice([p for p in _paths(manifest) if p])
    parent = manifest
    for key in path[:-1]:
        parent = parent[key]
    key, old = path[-1], parent[path[-1]]
    kind = rng.choice(["swap", "swap", "number", "delete"])
    if kind == "delete":
        del parent[key]
    elif kind == "number" and type(old) is int:
        parent[key] = rng.choice([old + 1, old - 1, -old, old * 2, old * 2**40, 0])
    else:
        parent[key] = rng.choice(VALUES)
    return manifest


def _text(manifest: dict, rng: random.Random) -> str:
    text = json.dumps(manifest)
    for placeholder, raw in RAW.items():
        text = text.replace(json.dumps(placeholder), raw)
    roll = rng.random()
    if roll < 0.05:  # cut off
        return text[:rng.randrange(len(text))]
    if roll < 0.10:  # a key written twice
        return text.replace('"backend": ', '"backend": "reference", "backend": ', 1)
    return text


def _alarm(*_):
    raise TimeoutError(f"a case took more than {SECONDS} s")


def _outcome(root: Path, expected: np.ndarray) -> str:
    """'error' (a DayzeroError) or 'same' (loaded, same outputs); anything else raises."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(SECONDS)
    try:
        model = runtime.load(root)
        got = model(IDS)[0]
    except DayzeroError:
        return "error"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    np.testing.assert_array_equal(got, expected)
    return "same"


def test_mutated_manifests_fail_cleanly_or_answer_the_same(tmp_path):
    root = write_artifact(tmp_path / "m.dz", vocab_graph(), "onnxruntime")
    pristine = json.loads((root / "manifest.json").read_text())
    expected = runtime.load(root)(IDS)[0]
    rng = random.Random(33)
    start = time.perf_counter()
    outcomes: dict[str, int] = {}
    for case in range(CASES):
        manifest = json.loads(json.dumps(pristine))
        for _ in range(rng.choice([1, 1, 2])):
            manifest = _mutate(manifest, rng)
        text = _text(manifest, rng)
        (root / "manifest.json").write_text(text, errors="surrogatepass")
        try:
            result = _outcome(root, expected)
        except BaseException as exc:
            raise AssertionError(f"case {case}: {type(exc).__name__}: {exc}\nmanifest: "
                                 f"{text[:2000]}") from exc
        outcomes[result] = outcomes.get(result, 0) + 1
    assert time.perf_counter() - start < BUDGET
    # the fuzz reaches both sides: edits that change nothing the runtime reads, and refusals
    assert outcomes.get("error", 0) > CASES // 2 and outcomes.get("same", 0) > 0, outcomes


@pytest.mark.parametrize("seed", range(3))
def test_every_single_field_deleted_or_retyped_fails_cleanly(tmp_path, seed):
    """Each key path of the manifest, set to one wrong-typed value (seeded per path)."""
    root = write_artifact(tmp_path / "m.dz", vocab_graph(), "onnxruntime")
    pristine = json.loads((root / "manifest.json").read_text())
    expected = runtime.load(root)(IDS)[0]
    rng = random.Random(seed)
    for path in [p for p in _paths(pristine) if p]:
        manifest = json.loads(json.dumps(pristine))
        parent = manifest
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = rng.choice(VALUES)
        text = _text(manifest, random.Random(0))
        (root / "manifest.json").write_text(text, errors="surrogatepass")
        try:
            _outcome(root, expected)
        except BaseException as exc:
            raise AssertionError(f"{path}: {type(exc).__name__}: {exc}") from exc
