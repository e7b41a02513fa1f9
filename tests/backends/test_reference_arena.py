"""The reference backend's arena executor: one allocation per run, every intermediate at its
planned offset, results equal to run_graph, and a measured peak equal to the plan."""

from __future__ import annotations

import dataclasses
import textwrap

import numpy as np
import pytest
import torch

import runtime
from backends.reference.arena import ArenaLayout, run_in_arena
from backends.reference.interpreter import run_graph
from compiler.errors import ArtifactError, InputError, VerificationError
from compiler.ir import parse_ir, verify
from compiler.writer import write_artifact
from passes.memory import MemoryPlan, plan_graph, verify_plan

# Covers every way a value is placed: own slots (linear, a materialised transpose, attention,
# topk's two results), views sharing a buffer (reshape; select and slice along dim 1 after a
# size-1 dim, at an offset), in-place results (add over %ar, exp over %tv), graph outputs that
# are views of intermediates (copied out), a view of an input, and a scalar constant.
BLOCK = """
    graph main {
      symbol s0 in [2, 16]
      input %x: f32[1, s0, 8]
      weight @w: f32[8, 8]
      weight @g: f32[8]
      %xf: f32[s0, 8] = reshape(%x) {shape=[s0, 8]}
      %h: f32[1, s0, 8] = rms_norm(%x, @g) {normalized_shape=[8]}
      %q: f32[1, s0, 8] = linear(%h, @w, _)
      %q4: f32[1, s0, 2, 4] = reshape(%q) {shape=[1, s0, 2, 4]}
      %qt: f32[1, 2, s0, 4] = permute(%q4) {dims=[0, 2, 1, 3]}
      %a: f32[1, 2, s0, 4] = scaled_dot_product_attention(%qt, %qt, %qt, _) {is_causal=true}
      %at: f32[1, s0, 2, 4] = permute(%a) {dims=[0, 2, 1, 3]}
      %ar: f32[1, s0, 8] = reshape(%at) {shape=[1, s0, 8]}
      %r: f32[1, s0, 8] = add(%ar, %x)
      %first: f32[1, 8] = select(%r) {dim=1, index=0}
      %tail: f32[1, s0 - 1, 8] = slice(%r) {dim=1, start=1, end=s0, step=1}
      %m: f32[1, 8] = amax(%tail) {dims=[1], keepdim=false}
      %two: f32[] = constant() {value=2.0, dtype=f32}
      %m2: f32[1, 8] = mul(%m, %two)
      %s: f32[1, 8] = add(%first, %m2)
      %tv: f32[1, s0, 2], %ti: i64[1, s0, 2] = topk(%r) {k=2, dim=-1}
      %e: f32[1, s0, 2] = exp(%tv)
      %flat: f32[2*s0] = reshape(%e) {shape=[-1]}
      %xs: f32[] = sum(%xf) {dims=[0, 1], keepdim=false}
      %o: f32[1, 8] = mul(%s, %xs)
      return %o, %flat, %ti
    }
"""


def block():
    g = parse_ir(textwrap.dedent(BLOCK))
    verify(g)
    gen = torch.Generator().manual_seed(0)
    data = {name: torch.randn(*v.type.shape, generator=gen) for name, v in g.weights.items()}
    return g, data


def inputs(seq: int, seed: int = 1):
    return [torch.randn(1, seq, 8, generator=torch.Generator().manual_seed(seed))]


def run(g, data, x, plan: MemoryPlan):
    return run_in_arena(g, data, x, ArenaLayout.from_plan(plan.to_json()))


def assert_same(got, expected):
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_block_exercises_every_kind_of_placement():
    g, _ = block()
    plan = plan_graph(g)
    verify_plan(plan, g)
    kinds = {a.value: (a.root, a.offset, a.kind) for a in plan.aliases}
    assert kinds["ar"] == ("at", 0, "view") and kinds["r"] == ("at", 0, "inplace")
    assert kinds["first"] == ("at", 0, "view") and kinds["tail"] == ("at", 32, "view")
    assert kinds["e"] == ("tv", 0, "inplace") and kinds["m2"] == ("m", 0, "inplace")
    assert {"h", "q", "qt", "a", "at", "m", "two", "tv", "xs"} == {b.value for b in plan.buffers}
    assert set(plan.external) == {"xf", "o", "flat", "ti"}


def test_arena_run_matches_run_graph_and_its_peak_equals_the_plan():
    g, data = block()
    plan = plan_graph(g)
    verify_plan(plan, g)
    x = inputs(16)  # the size the plan was made for (s0's upper bound)
    got, stats = run(g, data, x, plan)
    assert_same(got, run_graph(g, data, x))
    assert stats.arena_bytes == plan.arena_bytes  # the one allocation a run makes
    assert stats.high_water == plan.arena_bytes   # ... and the run reaches exactly its top
    assert stats.outside == []                    # no intermediate lives anywhere else
    assert stats.stored == len(plan.buffers) and stats.shared == len(plan.aliases)


@pytest.mark.parametrize("seq", [2, 5, 15])
def test_smaller_inputs_run_in_the_same_arena(seq):
    g, data = block()
    plan = plan_graph(g)
    got, stats = run(g, data, inputs(seq, seed=seq), plan)
    assert_same(got, run_graph(g, data, inputs(seq, seed=seq)))
    assert stats.arena_bytes == plan.arena_bytes and stats.high_water <= plan.arena_bytes
    assert stats.outside == []


def test_outputs_are_copied_out_of_the_arena():
    g, data = block()
    plan = plan_graph(g)
    layout = ArenaLayout.from_plan(plan.to_json())
    first, _ = run_in_arena(g, data, inputs(16), layout)
    kept = [t.clone() for t in first]
    run_in_arena(g, data, inputs(16, seed=7), layout)
    assert all(torch.equal(a, b) for a, b in zip(first, kept))
    assert not any(t._base is not None and t._base.dtype == torch.uint8 for t in first)


def test_the_executor_really_uses_the_planned_offsets():
    """Move %m onto the bytes of %first, which is read after %m is written (a plan the
    verifier rejects): the run computes %first + %m2 from clobbered bytes."""
    g, data = block()
    plan = plan_graph(g)
    by_name = {b.value: b for b in plan.buffers}
    clash = dataclasses.replace(by_name["m"], offset=by_name["at"].offset)
    bad = dataclasses.replace(plan, buffers=tuple(clash if b.value == "m" else b
                                                  for b in plan.buffers))
    with pytest.raises(VerificationError, match="overlap"):
        verify_plan(bad)
    got, _ = run(g, data, inputs(16), bad)
    expected = run_graph(g, data, inputs(16))
    assert not torch.allclose(got[0], expected[0])


def test_inputs_larger_than_a_plan_made_at_given_sizes_are_refused():
    g, data = block()
    plan = plan_graph(g, sizes={"s0": 4})
    got, stats = run(g, data, inputs(4), plan)
    assert_same(got, run_graph(g, data, inputs(4)))
    assert stats.high_water == plan.arena_bytes
    with pytest.raises(InputError, match="larger than the sizes the memory plan was made for"):
        run(g, data, inputs(5), plan)


# -- through an artifact ------------------------------------------------------------------------

def artifact(tmp_path, g, data, plan_json):
    g.weight_data.update(data)
    extra = {"memory_plan": plan_json} if plan_json is not None else {}
    return write_artifact(tmp_path / "m.dz", g, "reference", manifest_extra=extra)


def test_a_recorded_plan_runs_in_the_arena_after_loading(tmp_path):
    g, data = block()
    plan = plan_graph(g)
    model = runtime.load(artifact(tmp_path, g, data, plan.to_json()))
    x = inputs(16)[0].numpy()
    outputs = model(x)
    expected = run_graph(g, data, [torch.from_numpy(x)])
    for a, b in zip(outputs, expected):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-5, atol=1e-6)
    stats = model._executable.last_stats
    assert stats.arena_bytes == stats.high_water == plan.arena_bytes and stats.outside == []


def test_without_a_plan_the_backend_runs_the_plain_interpreter(tmp_path):
    g, data = block()
    model = runtime.load(artifact(tmp_path, g, data, None))
    model(inputs(3)[0].numpy())
    assert model._executable.layout is None and model._executable.last_stats is None


@pytest.mark.parametrize("edit,message", [
    (lambda p: p["buffers"].pop(), "does not place %"),
    (lambda p: p["buffers"][0].update(offset=p["arena_bytes"]), "does not fit"),
    (lambda p: p["aliases"][0].update(root="nowhere"), "has no slot"),
    (lambda p: p.pop("buffers"), "malformed"),
    (lambda p: p.update(format_version=2), "format version 2"),
])
def test_a_plan_that_does_not_fit_the_graph_is_refused_at_load(tmp_path, edit, message):
    g, data = block()
    plan = plan_graph(g).to_json()
    edit(plan)
    with pytest.raises(ArtifactError, match=message):
        runtime.load(artifact(tmp_path, g, data, plan))


def test_compile_records_the_plan_and_runs_with_it(tmp_path):
    import compiler
    from passes import DEFAULT_PIPELINE

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                torch.nn.Linear(32, 4)).eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    path = compiler.compile(model, (torch.randn(3, 8),), out=tmp_path / "mlp.dz",
                            backend="reference", dynamic_shapes=({0: batch},),
                            passes=DEFAULT_PIPELINE + ",schedule_for_memory,plan_memory")
    loaded = runtime.load(path)
    plan = MemoryPlan.from_json(loaded.manifest["memory_plan"])
    assert plan.sizes == {"s0": 64} and plan.arena_bytes == plan.lower_bound > 0
    for rows in (64, 5):
        x = torch.randn(rows, 8)
        (y,) = loaded(x)
        np.testing.assert_allclose(y, model(x).detach().numpy(), rtol=1e-5, atol=1e-5)
        stats = loaded._executable.last_stats
        assert stats.arena_bytes == plan.arena_bytes and stats.outside == []
    assert stats.high_water <= plan.arena_bytes
