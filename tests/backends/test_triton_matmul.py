"""The triton GEMM template under Triton's interpreter: linear / fused_linear / matmul kernels
(ragged edges, symbolic M, batches, strided operands, fused epilogues) match torch eager within
1e-4 (fp32); the examples run with their matmuls as kernels; the autotuner's selection logic
runs with a fake timer."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton (no CUDA here)

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import compiler  # noqa: E402
import runtime  # noqa: E402
from backends.triton import TritonBackend, kernel_sources  # noqa: E402
from backends.triton.autotune import Autotuner, Config, heuristic  # noqa: E402
from backends.triton.executable import _overlap, import_kernels  # noqa: E402
from backends.triton.matmul import generate_matmul, launch, misfit, prepare  # noqa: E402
from backends.triton.plan import plan  # noqa: E402
from compiler.ir import DType, Graph, TensorType, parse_ir, symbol, verify  # noqa: E402
from compiler.ir.ops.fused import ACTIVATIONS  # noqa: E402
from compiler.writer import write_artifact  # noqa: E402

pytest.importorskip("triton")

TOL = 1e-4
S = symbol("s0")
f32 = DType.f32


def _graph(build) -> Graph:
    g = Graph()
    g.symbols["s0"] = (1, 256)
    g.outputs = build(g)
    verify(g)
    return g


def _load(g: Graph, tmp_path):
    path = write_artifact(tmp_path / "m.dz", g, TritonBackend())
    return runtime.load(path)


def _steps(g: Graph, kind: str):
    return [s for s in plan(g) if s.kind == kind]


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


def _weight(g, name, *shape, seed=0):
    """Random weights scaled like a trained layer's (unit-size outputs)."""
    data = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) / shape[-1] ** 0.5
    return g.add_weight(name, TensorType(f32, shape), data), data


def _close(got, want, tol=TOL):
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("m,k,n,bias", [(1, 8, 16, True), (37, 70, 45, True), (150, 19, 130, False),
                                        (32, 32, 32, False)])
def test_linear_matches_eager_at_ragged_sizes(m, k, n, bias, tmp_path):
    def build(g):
        x = g.add_input("x", TensorType(f32, (m, k)))
        w, _ = _weight(g, "w", n, k)
        b = _weight(g, "b", n, seed=1)[0] if bias else None
        return [g.add_node("linear", [x, w, b]).output]

    g = _graph(build)
    assert len(_steps(g, "matmul")) == 1 and not _steps(g, "host")
    x = torch.randn(m, k)
    w, b = g.weight_data["w"], g.weight_data.get("b")
    _close(_load(g, tmp_path)(x)[0], F.linear(x, w, b))


def test_small_tiles_cover_many_programs_and_tile_groups():
    """Forced 16x16x16 tiles: 10 x 3 output tiles (more rows than a GROUP_M sweep), 3 ragged
    K steps, an out_in weight read through swapped strides, bias and relu in the epilogue."""
    g = _graph(lambda g: [g.add_node("fused_linear", [
        g.add_input("x", TensorType(f32, (150, 40))), g.add_input("w", TensorType(f32, (37, 40))),
        g.add_input("b", TensorType(f32, (37,)))], {"activation": "relu"}).output])
    kernel = generate_matmul("mm", g.nodes[0], [], [g.nodes[0].output], {})
    fn = import_kernels("import triton\nimport triton.language as tl\n\n" + kernel.source).mm
    x, w, b = torch.randn(150, 40), torch.randn(37, 40), torch.randn(37)
    out = torch.full((150, 37), float("nan"))
    prepared = prepare(kernel, [x, w, b], [out], interpreted=True)
    assert prepared.args[1].data_ptr() == w.data_ptr() and prepared.args[1].stride() == (1, 40)
    launch(fn, prepared, Config(16, 16, 16, 4, 2))
    _close(out.numpy(), torch.relu(F.linear(x, w, b)))


def test_one_artifact_serves_two_sequence_lengths(tmp_path):
    def build(g):
        x = g.add_input("x", TensorType(f32, (1, S, 24)))
        w, _ = _weight(g, "w", 40, 24)
        b, _ = _weight(g, "b", 40, seed=1)
        return [g.add_node("linear", [x, w, b]).output]

    g = _graph(build)
    (step,) = _steps(g, "matmul")
    assert "s0" not in step.kernel.source and step.kernel.batch == 0  # M is an argument
    loaded = _load(g, tmp_path)
    for seq in (5, 19):
        x = torch.randn(1, seq, 24)
        _close(loaded(x)[0], F.linear(x, g.weight_data["w"], g.weight_data["b"]))


def test_every_fused_linear_activation_is_in_the_epilogue(tmp_path):
    names = sorted(ACTIVATIONS)

    def build(g):
        x = g.add_input("x", TensorType(f32, (S, 12)))
        outs = []
        for i, name in enumerate(names):
            layout = "in_out" if i % 2 else "out_in"
            shape = (12, 9) if layout == "in_out" else (9, 12)
            w, _ = _weight(g, f"w{i}", *shape, seed=i)
            b, _ = _weight(g, f"b{i}", 9, seed=100 + i)
            outs.append(g.add_node("fused_linear", [x, w, b], {
                "activation": name, "weight_layout": layout}).output)
        return outs

    g = _graph(build)
    assert len(_steps(g, "matmul")) == len(names) and not _steps(g, "host")
    x = torch.randn(7, 12)
    got = _load(g, tmp_path)(x)
    torch_fns = {"none": lambda y: y, "relu": torch.relu, "gelu": F.gelu, "silu": F.silu,
                 "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
                 "sigmoid": torch.sigmoid, "tanh": torch.tanh}
    for i, name in enumerate(names):
        w, b = g.weight_data[f"w{i}"], g.weight_data[f"b{i}"]
        y = x @ w + b if i % 2 else F.linear(x, w, b)
        _close(got[i], torch_fns[name](y))


def test_batched_matmuls_with_broadcast_batches(tmp_path):
    shapes = [((2, 3, S, 8), (2, 3, 8, 5)),   # both batched
              ((3, 1, S, 6), (2, 6, 20)),      # batch dims broadcast on both sides
              ((S, 6), (2, 6, 4))]              # a matrix times a batch of matrices

    def build(g):
        return [g.add_node("matmul", [g.add_input(f"a{i}", TensorType(f32, a)),
                                      g.add_input(f"b{i}", TensorType(f32, b))]).output
                for i, (a, b) in enumerate(shapes)]

    g = _graph(build)
    assert [s.kernel.batch for s in _steps(g, "matmul")] == [2, 2, 1]
    loaded = _load(g, tmp_path)
    for seq in (3, 17):
        args = [torch.randn(*[seq if d is S else d for d in shape]) for pair in shapes
                for shape in pair]
        got = loaded(*args)
        for i in range(len(shapes)):
            _close(got[i], args[2 * i] @ args[2 * i + 1])


def test_transposed_operands_are_read_through_strides(tmp_path):
    def build(g):
        a = g.add_input("a", TensorType(f32, (10, S)))       # used as a^T: [s0, 10]
        b = g.add_input("b", TensorType(f32, (2, 13, 10)))   # used as b^T per batch: [10, 13]
        at = g.add_node("permute", [a], {"dims": [1, 0]}).output
        bt = g.add_node("permute", [b], {"dims": [0, 2, 1]}).output
        return [g.add_node("matmul", [at, bt]).output]

    g = _graph(build)
    assert len(_steps(g, "matmul")) == 1
    a, b = torch.randn(10, 21), torch.randn(2, 13, 10)
    _close(_load(g, tmp_path)(a, b)[0], a.t() @ b.transpose(1, 2))


def test_residual_add_and_swiglu_run_in_the_epilogue(tmp_path):
    def build(g):
        x = g.add_input("x", TensorType(f32, (S, 16)))
        gate = g.add_node("linear", [x, _weight(g, "wg", 24, 16)[0], None]).output
        up = g.add_node("linear", [x, _weight(g, "wu", 24, 16, seed=1)[0], None]).output
        act = g.add_node("silu", [gate], {"fusion_group": 0}).output
        hidden = g.add_node("mul", [act, up], {"fusion_group": 0}).output
        down = g.add_node("linear", [hidden, _weight(g, "wd", 16, 24, seed=2)[0], None]).output
        out = g.add_node("add", [down, x]).output
        shared = g.add_node("linear", [out, _weight(g, "wo", 16, 16, seed=3)[0], None]).output
        return [g.add_node("exp", [shared]).output, shared]  # returned: no epilogue

    g = _graph(build)
    kernels = [s.kernel for s in _steps(g, "matmul")]
    assert [len(k.nodes) for k in kernels] == [1, 3, 2, 1]
    assert [s.kernel.name for s in plan(g) if s.kind == "kernel"] == ["k4_exp"]
    x = torch.randn(11, 16)
    w = g.weight_data
    hidden = F.silu(x @ w["wg"].t()) * (x @ w["wu"].t())
    shared = (hidden @ w["wd"].t() + x) @ w["wo"].t()
    got = _load(g, tmp_path)(x)
    _close(got[0], torch.exp(shared))
    _close(got[1], shared)


def test_template_misfits_run_through_torch(tmp_path):
    def build(g):
        ints = g.add_node("matmul", [g.add_input("a", TensorType(DType.i64, (S, 3))),
                                     g.add_input("b", TensorType(DType.i64, (3, 2)))]).output
        vec = g.add_node("matmul", [g.add_input("m", TensorType(f32, (S, 5))),
                                    g.add_input("v", TensorType(f32, (5,)))]).output
        return [ints, vec]

    g = _graph(build)
    assert [misfit(n) for n in g.nodes] == ["operands are not one float dtype (f32, f16, bf16)",
                                            "the right operand is a vector"]
    assert not _steps(g, "matmul") and len(_steps(g, "host")) == 2
    a, b = torch.randint(-5, 5, (4, 3)), torch.randint(-5, 5, (3, 2))
    m, v = torch.randn(4, 5), torch.randn(5)
    got = _load(g, tmp_path)(a, b, m, v)
    np.testing.assert_array_equal(got[0], (a @ b).numpy())
    _close(got[1], m @ v)


def test_bf16_linear_runs_through_the_interpreter(tmp_path):
    g = _graph(lambda g: [g.add_node("linear", [
        g.add_input("x", TensorType(DType.bf16, (S, 32))),
        g.add_input("w", TensorType(DType.bf16, (24, 32))), None]).output])
    assert len(_steps(g, "matmul")) == 1
    x, w = torch.randn(6, 32).bfloat16(), torch.randn(24, 32).bfloat16()
    (got,) = _load(g, tmp_path)._executable.run_tensors([x, w])
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), F.linear(x.float(), w.float()), rtol=1e-2, atol=2e-2)


def test_overlap_is_by_byte_range():
    arena = torch.zeros(64)
    assert _overlap(arena[0:16], arena[8:24]) and not _overlap(arena[0:16], arena[16:32])
    assert _overlap(arena[0:32].view(4, 8).t(), arena[24:25])
    assert not _overlap(arena[0:16], torch.zeros(16))


# -- the examples, with their matmuls as kernels --------------------------------------------------
PLANNED = "remove_noops,fold_constants,eliminate_dead_code,fuse_groups,plan_memory"
FUSED = "remove_noops,fold_constants,eliminate_dead_code,fuse,fuse_groups,plan_memory"


def _matmul_kernels(path) -> dict[str, str]:
    graph = parse_ir((path / "graph.dzir").read_text())
    assert not [s for s in plan(graph) if s.kind == "host" and s.node.op in ("matmul", "linear")]
    return {n: s for n, s in kernel_sources(graph).items() if "tl.dot" in s}


def test_mlp_example_runs_its_linears_as_kernels(tmp_path, capsys):
    from compiler.cli import main
    from examples.mlp import build

    model, inputs, dynamic = build()
    path = compiler.compile(model, inputs, out=tmp_path / "m.dz", backend="triton",
                            dynamic_shapes=dynamic, passes=FUSED)
    kernels = _matmul_kernels(path)
    assert len(kernels) == 3 and sum("tl.erf" in s for s in kernels.values()) == 2
    assert main(["inspect", str(path), "--kernels"]) == 0
    assert capsys.readouterr().out.count("tl.dot(") == 3
    loaded = runtime.load(path)
    for rows in (1, 9):
        x = torch.randn(rows, inputs[0].shape[1])
        _close(loaded(x)[0], model(x))


@pytest.mark.parametrize("passes", [PLANNED, FUSED])
def test_tiny_llama_runs_its_projections_as_kernels(passes, tmp_path):
    from examples.llama import build

    model, inputs, dynamic = build()
    path = compiler.compile(model, inputs, out=tmp_path / "m.dz", backend="triton",
                            dynamic_shapes=dynamic, passes=passes)
    assert len(_matmul_kernels(path)) >= 9  # per layer q/k/v (or one qkv), o, gate, up, down
    loaded = runtime.load(path)
    exe, placed = loaded._executable, []
    run_matmul = exe.handlers["matmul"]

    def spy(step, env, bindings):  # where each GEMM output landed: its arena slot
        run_matmul(step, env, bindings)
        placed.extend(_overlap(env[name], exe.arena) for name in step.kernel.outputs
                      if name in exe.slots)  # values planned in place in another have none

    exe.handlers["matmul"] = spy
    for seq in (8, 5):
        ids = torch.randint(0, 256, (1, seq), generator=torch.Generator().manual_seed(seq))
        _close(loaded(ids)[0], model(ids))
    assert len(placed) >= 4 and all(placed)


# -- autotuning, with a fake timer ----------------------------------------------------------------
class FakeTimer:
    """Times each config from a table (default 10), recording what it was asked to time."""

    def __init__(self, times):
        self.times, self.calls = times, []

    def __call__(self, run, config):
        run(config)
        self.calls.append(config)
        return self.times.get(config, 10.0)


def test_autotune_picks_the_fastest_and_caches_per_size_bucket():
    winner = Config(64, 64, 32, 4, 4)
    timer = FakeTimer({winner: 1.0})
    tuner, ran = Autotuner(enabled=True, timer=timer), []
    assert tuner.choose("k0", (200, 256, 64, 1), ran.append) == winner
    tried = list(timer.calls)
    assert len(tried) > 1 and winner in tried and ran == tried
    assert tried[0] == heuristic((200, 256, 64, 1))
    assert tuner.choose("k0", (250, 256, 64, 1), ran.append) == winner  # same bucket: cached
    assert timer.calls == tried
    timer.times = {Config(32, 64, 32, 4, 5): 0.5}
    assert tuner.choose("k0", (20, 256, 64, 1), ran.append) == Config(32, 64, 32, 4, 5)
    timer.times, before = {}, len(timer.calls)  # all tie: the first candidate, the heuristic's
    assert tuner.choose("k1", (250, 256, 64, 1), ran.append) == heuristic((250, 256, 64, 1))
    assert len(timer.calls) > before  # another kernel tunes on its own
    assert set(tuner.cache) == {("k0", (256, 256, 64, 1)), ("k0", (32, 256, 64, 1)),
                                ("k1", (256, 256, 64, 1))}


def test_autotune_skips_failing_configs_and_is_off_under_the_interpreter():
    def big_tiles_fail(run, config):
        if config.block_m == 128:
            raise RuntimeError("out of shared memory")
        return float(config.block_k + config.block_n)

    best = Autotuner(enabled=True, timer=big_tiles_fail).choose("k0", (512, 512, 512, 1), print)
    assert best == Config(64, 64, 32, 4, 4)  # ties with (32, 64, 32): the earlier one wins

    def all_fail(run, config):
        raise RuntimeError("out of shared memory")

    with pytest.raises(RuntimeError, match="shared memory"):
        Autotuner(enabled=True, timer=all_fail).choose("k0", (64, 64, 64, 1), print)
    off = Autotuner(enabled=False, timer=FakeTimer({}))
    assert off.choose("k0", (5, 40, 24, 1), print) == Config(16, 64, 32, 4, 3)
    assert off.timer.calls == [] and off.cache == {}
    assert heuristic((5, 40, 300, 1), itemsize=2).block_k == 64
