"""The runtime's load-time check of a recorded memory plan (runtime/memory_plan.py)."""

from __future__ import annotations

import json
import random
import time

import pytest

import runtime
from compiler.errors import ArtifactError
from runtime.memory_plan import _Buffer, _check_disjoint
from tests.backends.test_reference_arena import artifact, block, inputs

plan_graph = pytest.importorskip("passes.memory").plan_graph


def planned(tmp_path, edit=None):
    g, data = block()
    plan = plan_graph(g).to_json()
    if edit is not None:
        edit(plan)
    return artifact(tmp_path, g, data, plan)


def buffer(plan, name):
    return next(b for b in plan["buffers"] if b["value"] == name)


def test_a_sound_plan_loads_and_runs(tmp_path):
    m = runtime.load(planned(tmp_path))
    m(inputs(16)[0].numpy())


def move_m_onto_at(plan):
    """%m is written while %at's buffer is still read (by %first): silently wrong outputs."""
    buffer(plan, "m")["offset"] = buffer(plan, "at")["offset"]


def test_a_buffer_moved_onto_a_live_one_is_refused(tmp_path):
    with pytest.raises(ArtifactError, match=r"buffers of %\w+ .* and %\w+ .* overlap while both "
                                            "are live") as info:
        runtime.load(planned(tmp_path, move_m_onto_at))
    assert info.value.where.endswith("manifest.json: memory_plan")


def test_the_recorded_live_steps_are_not_trusted(tmp_path):
    def edit(plan):
        move_m_onto_at(plan)
        for b in plan["buffers"]:  # claim nothing is live together
            b["first"] = b["last"] = plan["buffers"].index(b)
    with pytest.raises(ArtifactError, match="overlap while both are live"):
        runtime.load(planned(tmp_path, edit))


@pytest.mark.parametrize("edit, message", [
    (lambda p: p.update(alignment=0), r"memory plan alignment is 0, not a whole number"),
    (lambda p: p.update(alignment="64"), "memory plan alignment is '64'"),
    (lambda p: p.update(arena_bytes=10**15), r"arena is 1000000000000000 bytes but its buffers "
                                             "end at byte"),
    (lambda p: buffer(p, "h").update(size=buffer(p, "h")["size"] * 1000), "does not fit"),
    (lambda p: buffer(p, "h").update(offset=buffer(p, "h")["offset"] + 4), "does not fit"),
    (lambda p: buffer(p, "h").update(offset=-64), "malformed"),
    (lambda p: p["sizes"].update(s0=10**9), r"size s0=1000000000 is not a value"),
    (lambda p: p["buffers"].append(dict(p["buffers"][0])), "malformed"),
    (lambda p: p["aliases"][0].update(offset=10**6), r"at byte 1000000 of the .* it does not fit"),
    (lambda p: next(a for a in p["aliases"] if a["kind"] == "inplace").update(offset=64),
     "malformed"),
])
def test_a_malformed_plan_is_an_artifact_error(tmp_path, edit, message):
    with pytest.raises(ArtifactError, match=message):
        runtime.load(planned(tmp_path, edit))


def brute_force_overlap(buffers) -> bool:
    return any(a.first <= b.last and b.first <= a.last and a.offset < b.end and b.offset < a.end
               for i, a in enumerate(buffers) for b in buffers[i + 1:] if a.size and b.size)


@pytest.mark.parametrize("seed", range(300))
def test_the_sweep_agrees_with_checking_every_pair(seed):
    rng = random.Random(seed)
    buffers = []
    for i in range(rng.randint(1, 12)):
        first = rng.randint(0, 8)
        buffers.append(_Buffer(f"v{i}", rng.randint(0, 10) * 8, rng.randint(0, 4) * 8, first,
                               first + rng.randint(0, 4)))
    try:
        _check_disjoint(buffers, "plan")
        found = False
    except ArtifactError:
        found = True
    assert found == brute_force_overlap(buffers)


def test_the_sweep_is_fast_on_many_buffers():
    n = 60_000  # a chain of values, each live for two steps, reusing two slots: no overlap
    buffers = [_Buffer(f"v{i}", (i % 2) * 64, 64, i, i + 1) for i in range(n)]
    start = time.perf_counter()
    _check_disjoint(buffers, "plan")
    assert time.perf_counter() - start < 5
    buffers.append(_Buffer("late", 32, 64, n - 1, n - 1))
    with pytest.raises(ArtifactError, match="%late"):
        _check_disjoint(buffers, "plan")


def test_a_plan_on_disk_is_checked_by_runtime_load_before_the_backend(tmp_path):
    out = planned(tmp_path)
    manifest = json.loads((out / "manifest.json").read_text())
    move_m_onto_at(manifest["memory_plan"])
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="overlap"):
        runtime.load(out)
