"""The triton backend under Triton's interpreter: generated kernels match torch eager (fp32,
1e-4) for every fusion kind, a subset of ops, the MLP and tiny Llama examples, at several sizes
of the symbolic dims from one artifact; stored kernel hashes are checked at load."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton (no CUDA here)

import json  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import compiler  # noqa: E402
import runtime  # noqa: E402
from backends.triton import kernel_sources  # noqa: E402
from compiler.errors import ArtifactError  # noqa: E402
from compiler.ir import parse_ir  # noqa: E402

pytest.importorskip("triton")

PIPELINE = "remove_noops,fold_constants,eliminate_dead_code,fuse_groups"
PLANNED = PIPELINE + ",plan_memory"  # intermediates in one arena
TOL = 1e-4


def _compile(model, inputs, tmp_path, dynamic=None, passes=PIPELINE):
    path = compiler.compile(model, inputs, out=tmp_path / "m.dz", backend="triton",
                            dynamic_shapes=dynamic, passes=passes)
    return path, runtime.load(path)


def _kernels(path):
    return kernel_sources(parse_ir((path / "graph.dzir").read_text()))


def _check(loaded, model, inputs):
    got = loaded(*inputs)
    want = model(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.detach().numpy(), rtol=TOL, atol=TOL)


class Chain(nn.Module):  # elementwise chain with broadcasts of a weight and a bias
    def __init__(self):
        super().__init__()
        self.w, self.b = nn.Parameter(torch.randn(16)), nn.Parameter(torch.randn(1, 16))

    def forward(self, x):
        return torch.sigmoid(torch.relu(x * self.w + self.b) - 0.5) * x


class RmsNorm(nn.Module):  # reduction with prologue (x^2) and epilogue (rsqrt, scale)
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w


class Softmax(nn.Module):  # softmax with an elementwise prologue and epilogue
    def forward(self, x):
        return torch.softmax(x * 0.5, dim=-1) + 1.0


class Stats(nn.Module):  # several reductions over one domain, per-row outputs
    def forward(self, x):
        return x.sum(-1), x.amax(-1), x.var(-1), torch.log_softmax(x, -1)


class LayerNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        return torch.nn.functional.gelu(self.norm(x) + x)


@pytest.mark.parametrize("cls", [Chain, RmsNorm, Softmax, Stats, LayerNorm])
def test_fusion_kinds_match_eager_at_several_sizes(cls, tmp_path):
    torch.manual_seed(0)
    model = cls().eval()
    batch = torch.export.Dim("batch", min=2, max=64)
    path, loaded = _compile(model, (torch.randn(4, 16),), tmp_path, ({0: batch},))
    kernels = _kernels(path)
    assert kernels and all("@triton.jit" in s for s in kernels.values())
    if cls in (Chain, RmsNorm, Softmax):  # one kernel for the whole group
        assert len(kernels) == 1, list(kernels)
    for rows in (3, 17):
        _check(loaded, model, (torch.randn(rows, 16),))


class Unary(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


UNARY = {"exp": torch.exp, "tanh": torch.tanh, "gelu_tanh":
         lambda x: torch.nn.functional.gelu(x, approximate="tanh"), "silu":
         torch.nn.functional.silu, "abs": torch.abs, "neg": torch.neg, "cos": torch.cos,
         "clamp": lambda x: x.clamp(-0.5, 0.5), "where": lambda x: torch.where(x > 0, x, -x),
         "erf": torch.erf, "maximum": lambda x: torch.maximum(x, x.flip(0))}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_ops_match_eager(name, tmp_path):
    model = Unary(UNARY[name])
    _, loaded = _compile(model, (torch.randn(3, 5),), tmp_path)
    _check(loaded, model, (torch.randn(3, 5),))


def test_mlp_example_matches_eager_at_three_sizes(tmp_path):
    from examples.mlp import build

    model, inputs, dynamic = build()
    path, loaded = _compile(model, inputs, tmp_path, dynamic, passes=PLANNED)
    assert _kernels(path)
    assert loaded._executable.arena_bytes > 0 and loaded._executable.slots
    for rows in (1, 4, 9):
        _check(loaded, model, (torch.randn(rows, inputs[0].shape[1]),))


def test_tiny_llama_matches_eager_at_two_lengths(tmp_path):
    from examples.llama import build

    model, inputs, dynamic = build()
    path, loaded = _compile(model, inputs, tmp_path, dynamic, passes=PLANNED)
    assert len(_kernels(path)) > 5
    assert loaded._executable.arena_bytes > 0
    for seq in (8, 5):
        ids = torch.randint(0, 256, (1, seq), generator=torch.Generator().manual_seed(seq))
        _check(loaded, model, (ids,))


def test_kernel_list_hashes_are_checked_at_load(tmp_path):
    model = Chain().eval()
    path, _ = _compile(model, (torch.randn(4, 16),), tmp_path)
    listing = json.loads((path / "backend" / "kernels.json").read_text())
    assert listing["kernels"] and len(listing["module_sha256"]) == 64
    from backends.triton import TritonBackend

    class Tampered:  # an artifact view whose kernel hash does not match the regenerated source
        root, manifest = path, {}

        def graph_text(self):
            return (path / "graph.dzir").read_text()

        def weights(self, framework="np"):
            return {}

        def payload_path(self, relpath):
            fake = tmp_path / "kernels.json"
            fake.write_text(json.dumps({**listing, "module_sha256": "0" * 64}))
            return fake

    with pytest.raises(ArtifactError, match="regenerated"):
        TritonBackend().load(Tampered())


class ConvNet(nn.Module):  # conv has no Triton kernel: it runs on the fallback
    def __init__(self):
        super().__init__()
        self.conv, self.norm = nn.Conv1d(4, 8, 3, padding=1), nn.LayerNorm(8)

    def forward(self, x):
        y = self.conv(torch.relu(x * 2.0)).transpose(1, 2)
        return self.norm(torch.nn.functional.gelu(y))


def test_uncovered_op_runs_on_the_fallback(tmp_path):
    torch.manual_seed(0)
    model = ConvNet().eval()
    steps = torch.export.Dim("steps", min=2, max=64)
    path = compiler.compile(model, (torch.randn(2, 4, 10),), out=tmp_path / "m.dz",
                            backend="triton", fallback="onnxruntime", passes=PIPELINE,
                            dynamic_shapes=({2: steps},))
    listing = json.loads((path / "backend" / "kernels.json").read_text())
    assert [(s["backend"], s["nodes"]) for s in listing["segments"]] == \
        [("onnxruntime", ["conv1d"])]
    assert listing["kernels"]  # the rest is generated kernels
    loaded = runtime.load(path)
    for length in (10, 5):
        _check(loaded, model, (torch.randn(2, 4, length),))


def test_fallback_segments_get_the_fallback_backends_options(tmp_path):
    """backend_options.onnxruntime reach the segments lowered by onnxruntime inside a triton
    artifact, and load-time session settings reach their sessions."""
    torch.manual_seed(0)
    model = ConvNet().eval()
    path = compiler.compile(model, (torch.randn(2, 4, 10),), out=tmp_path / "m.dz",
                            backend="triton", fallback="onnxruntime", passes=PIPELINE,
                            backend_options={"onnxruntime": {"session": {
                                "intra_op_threads": 1, "allow_spinning": False}}})
    record = json.loads((path / "backend" / "fallback" / "0" / "lowering.json").read_text())
    assert record["session"]["intra_op_threads"] == 1
    loaded = runtime.load(path, session={"intra_op_threads": 2})
    (segment, executable), = loaded._executable.fallbacks
    assert executable.settings.intra_op_threads == 2
    _check(loaded, model, (torch.randn(2, 4, 10),))


def test_uncovered_op_without_fallback_is_refused(tmp_path):
    from compiler.errors import DayzeroError

    with pytest.raises(DayzeroError, match="conv"):
        compiler.compile(ConvNet().eval(), (torch.randn(2, 4, 10),), out=tmp_path / "m.dz",
                         backend="triton", passes=PIPELINE)
    assert not (tmp_path / "m.dz").exists()


def test_partitioner_tags_maximal_runs(tmp_path):
    from backends.capability_partition import assign, segments
    from backends.registry import get

    graph = compiler.export(ConvNet().eval(), (torch.randn(2, 4, 10),))
    tags = assign(graph, get("triton"), get("onnxruntime"))
    parts = segments(graph, tags)
    assert [p.backend for p in parts] == ["triton", "onnxruntime", "triton"]
    assert sum(len(p.nodes) for p in parts) == len(graph.nodes)
    assert parts[1].inputs == parts[0].outputs and parts[2].inputs == parts[1].outputs


def test_inspect_kernels_prints_generated_source(tmp_path, capsys):
    from compiler.cli import main

    path, _ = _compile(Softmax(), (torch.randn(4, 16),), tmp_path)
    assert main(["inspect", str(path), "--kernels"]) == 0
    out = capsys.readouterr().out
    assert out.count("@triton.jit") == len(_kernels(path)) == 1
    assert "tl.exp" in out and "tl.sum" in out


@pytest.mark.parametrize("case", ["plain", "causal", "gqa_bool_mask", "additive_mask",
                                  "window"])
def test_flash_attention_kernel_matches_torch(case):
    from backends.triton.attention import attention

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 19, 16, generator=gen)
    heads_kv = 2 if case == "gqa_bool_mask" else 4
    k, v = (torch.randn(2, heads_kv, 23, 16, generator=gen) for _ in range(2))
    kwargs, mask = {}, None
    if case == "causal":
        kwargs["is_causal"] = True
    if case == "gqa_bool_mask":
        mask, kwargs["enable_gqa"] = torch.rand(19, 23, generator=gen) > 0.3, True
        mask[:, 0] = True
    if case == "additive_mask":
        mask = torch.randn(2, 1, 19, 23, generator=gen)
    if case == "window":  # 5 keys: the query's own and 4 before, across key blocks of 16
        k, v = k[:, :, :19], v[:, :, :19]
        mask = torch.ones(19, 19, dtype=torch.bool).tril().triu(-4)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, mask, **kwargs)
    if case == "window":
        kwargs, mask = {"is_causal": True, "window": 5}, None
    got = attention(q, k, v, mask, **kwargs)
    torch.testing.assert_close(got, want, rtol=TOL, atol=TOL)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the benchmark runs for real on a GPU")
def test_gpu_benchmark_skips_cleanly_without_cuda(capsys):
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu.py"
    spec = importlib.util.spec_from_file_location("gpu_benchmark", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main([]) == 0
    assert "skipped, no CUDA device" in capsys.readouterr().out


NON_TRAILING = {"sum0": lambda x: x.sum(0), "mean01_keep": lambda x: x.mean((0, 1), keepdim=True),
                "amax1": lambda x: x.amax(1), "softmax1": lambda x: torch.softmax(x, 1),
                "var0": lambda x: x.var(0), "log_softmax0": lambda x: torch.log_softmax(x, 0)}


@pytest.mark.parametrize("name", sorted(NON_TRAILING))
def test_reductions_over_leading_dims_are_kernels(name, tmp_path):
    model = Unary(NON_TRAILING[name])
    x = torch.randn(3, 5, 4)
    path, loaded = _compile(model, (x,), tmp_path)
    assert len(_kernels(path)) == 1
    _check(loaded, model, (torch.randn(3, 5, 4),))


@pytest.mark.parametrize("cls", [RmsNorm, Softmax, LayerNorm])
def test_fp16_kernels_compute_in_fp32_and_store_fp16(cls, tmp_path):
    torch.manual_seed(0)
    model = cls().eval().half()
    x = torch.randn(4, 16).half()
    _, loaded = _compile(model, (x,), tmp_path)
    got = loaded(x)[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), model(x).float().detach().numpy(),
                               rtol=5e-3, atol=5e-3)


class Chain(nn.Module):
    def forward(self, x):
        return (-x * 2.0) + 1.0


@pytest.mark.parametrize("shift", [256, -256, 0])
def test_output_slot_laid_over_its_input_at_another_offset(tmp_path, shift):
    """A memory plan may put a kernel's output where its dying input was, at another offset;
    with several programs per kernel, writing it directly would overwrite input elements a
    later program has yet to read. Exactly in place (shift 0) is safe and kept."""
    model = Chain().eval()
    x = torch.randn(4096)
    path = compiler.compile(model, (x,), out=tmp_path / "m.dz", backend="triton",
                            passes="remove_noops,fold_constants,plan_memory")
    loaded = runtime.load(path)
    executable = loaded._executable
    graph = executable.graph
    neg, mul = (n.outputs[0].name for n in graph.nodes if n.op in ("neg", "mul"))
    size = 4096 * 4
    base = 4 * abs(shift) if shift < 0 else 0
    executable.slots = {neg: (base, size), mul: (base + 4 * shift, size)}
    executable.arena_bytes = size + 4 * abs(shift)
    np.testing.assert_allclose(loaded(x)[0], model(x).numpy(), rtol=1e-6, atol=1e-6)


class ReturnsAView(nn.Module):
    """Returns a view (a reshape of a slice) of an intermediate whose arena bytes a later node
    reuses: the KV-cached generation step returns each layer's new values this way."""

    def forward(self, x):
        fused = x * 3.0                      # in the arena
        values = fused[:, 8:].reshape(-1)    # a view of it, returned
        later = torch.exp(x)                 # may take fused's bytes once it is dead
        return values, later + 1.0


def test_a_returned_view_of_an_arena_value_is_copied_out(tmp_path):
    """The memory plan keeps graph outputs out of the arena and expects a returned view to be
    copied out when produced; here `exp` is laid over the dead `mul`, as a plan may do."""
    model = ReturnsAView().eval()
    x = torch.randn(1, 16)
    path = compiler.compile(model, (x,), out=tmp_path / "m.dz", backend="triton",
                            passes="remove_noops,fold_constants,plan_memory")
    loaded = runtime.load(path)
    executable = loaded._executable
    names = {n.op: n.outputs[0].name for n in executable.graph.nodes}
    executable.slots = {names["mul"]: (0, 64), names["exp"]: (0, 64)}
    executable.arena_bytes = 64
    got = loaded(x)
    for g, w in zip(got, model(x)):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-6, atol=1e-6)
