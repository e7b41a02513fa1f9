"""NaN and Inf reach the outputs exactly where torch eager puts them, on every backend.

A model is compiled with a NaN or an Inf in an input or a weight; the artifact's outputs must be
NaN (and +-Inf) at exactly eager's positions, and its finite values must agree within
1e-5 x max(1, max |eager|). Every lowering a backend chooses is covered by some case here: the
ONNX Runtime contrib kernels (FusedMatMul, Gelu, FastGelu, QuickGelu, SkipLayerNormalization,
MultiHeadAttention) and dayzero's own CausalAttention through the Llama decoder.

Eager runs scaled_dot_product_attention with the math backend: torch 2.13's default CPU kernel
(flash attention) drops a NaN query row for some shapes (a NaN in q of [2, 4, 7, 8] gives no NaN
at all), which is the very bug these tests exist to catch.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton (no CUDA here)

import json  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import compiler  # noqa: E402
import runtime  # noqa: E402
from backends.onnxruntime.fused import ContribFallbackWarning  # noqa: E402
from tests.sweeps import sweep  # noqa: E402
from tests.test_end_to_end import build  # noqa: E402

BACKENDS = ["reference", "onnxruntime", "triton"]
# The onnxruntime backend again, with dayzero's CausalAttention excluded (the attention block
# then lowers to ORT's GroupQueryAttention), and with every fused kernel excluded (standard ops).
ORT_VARIANTS = {
    "onnxruntime-gqa": ["ai.dayzero.CausalAttention"],
    "onnxruntime-standard": None,  # filled in by _options
}
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _backend(name: str):
    if name == "triton":
        pytest.importorskip("triton")
    return name.split("-")[0]


def _options(name: str) -> dict:
    if name not in ORT_VARIANTS:
        return {}
    excluded = ORT_VARIANTS[name]
    if excluded is None:
        from backends.onnxruntime.fused import VARIANTS

        excluded = sorted({str(k) for vs in VARIANTS.values() for v in vs for k in v.requires})
    return {"backend_options": {"onnxruntime": {"exclude_kernels": excluded}}}


def eager(model, inputs) -> list[np.ndarray]:
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        out = model(*inputs)
    return [t.numpy() for t in ((out,) if isinstance(out, torch.Tensor) else out)]


def assert_like_eager(got, want) -> None:
    """NaN at exactly eager's positions, the same infinities, finite values within
    1e-5 x max(1, max |eager|)."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g = np.asarray(g)
        assert g.shape == w.shape
        np.testing.assert_array_equal(np.argwhere(np.isnan(g)), np.argwhere(np.isnan(w)))
        np.testing.assert_array_equal(np.argwhere(np.isposinf(g)), np.argwhere(np.isposinf(w)))
        np.testing.assert_array_equal(np.argwhere(np.isneginf(g)), np.argwhere(np.isneginf(w)))
        finite = np.isfinite(w)
        bound = 1e-5 * max(1.0, float(np.abs(w[finite]).max(initial=0.0)))
        np.testing.assert_allclose(g[finite], w[finite], rtol=0, atol=bound)


def compile_and_run(model, inputs, backend, tmp_path, dynamic=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ContribFallbackWarning)  # the excluded kernels
        path = compiler.compile(model, inputs, out=tmp_path / "m.dz", backend=_backend(backend),
                                dynamic_shapes=dynamic, **_options(backend))
    return runtime.load(path)(*inputs)


# --- the Llama example (token ids in, so the non-finite value goes into a weight) -------------

def _llama_with(where: str, value: float):
    model, (ids,), dynamic = build("llama")
    ids = torch.tensor([[5, 17, 99, 3, 17, 250, 8, 1]])
    llama = model.model
    with torch.no_grad():
        if where == "lm_head":  # one vocabulary row: that logit column, every token
            llama.lm_head.weight[42, 7] = value
        elif where == "embedding":  # token 99 (position 2): its hidden row, then everything
            llama.model.embed_tokens.weight[99, 11] = value
        elif where == "o_proj":  # one output channel of layer 1's attention projection
            llama.model.layers[1].self_attn.o_proj.weight[3, 5] = value
        elif where in ("q_proj", "k_proj"):  # one channel of every token's q (or k) in layer
            # 0: NaN scores in one head (or KV group), which an attention kernel must not drop
            getattr(llama.model.layers[0].self_attn, where).weight[20, 7] = value
    return model, (ids,), dynamic


LLAMA_CASES = [(backend, where, value)
               for where, value in [("lm_head", np.nan), ("lm_head", np.inf),
                                    ("lm_head", -np.inf), ("embedding", np.nan),
                                    ("embedding", np.inf), ("o_proj", np.nan),
                                    ("q_proj", np.nan), ("k_proj", np.nan), ("k_proj", np.inf)]
               for backend in BACKENDS + sorted(ORT_VARIANTS)]


def _llama_id(case) -> str:
    backend, where, value = case
    return f"{backend}-{where}-{value}"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every Llama case is a compile: CI runs NaN/Inf in q and k (what an attention kernel may
    drop) on every backend plus a fixed sample of the rest; `pytest --sweep` runs all 45."""
    if metafunc.definition.name == "test_llama_with_a_nonfinite_weight":
        always = {_llama_id(c) for c in LLAMA_CASES if c[1] in ("q_proj", "k_proj")
                  and not (c[1] == "k_proj" and c[2] != np.inf)}
        cases = sweep(metafunc.config, LLAMA_CASES, _llama_id, always=always)
        metafunc.parametrize("backend, where, value", cases, ids=[_llama_id(c) for c in cases])


def test_llama_with_a_nonfinite_weight(backend, where, value, tmp_path):
    model, inputs, dynamic = _llama_with(where, value)
    want = eager(model, inputs)
    assert not np.isfinite(want[0]).all()
    assert_like_eager(compile_and_run(model, inputs, backend, tmp_path, dynamic), want)


def _variants(model, inputs, backend, tmp_path, dynamic=None) -> set[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ContribFallbackWarning)
        path = compiler.compile(model, inputs, out=tmp_path / f"{backend}.dz",
                                backend="onnxruntime", dynamic_shapes=dynamic, force=True,
                                **_options(backend))
    return set(json.loads((path / "backend" / "lowering.json").read_text())["variants"])


@pytest.mark.parametrize("backend, kernel", [
    ("onnxruntime", "ai.dayzero.CausalAttention"),
    ("onnxruntime-gqa", "com.microsoft.GroupQueryAttention"),
])
def test_the_llama_cases_run_the_attention_kernel(backend, kernel, tmp_path):
    """The Llama cases above exercise dayzero's kernel (where built) and ORT's GQA."""
    from backends.onnxruntime import native_ops

    if kernel.startswith("ai.dayzero") and native_ops.library() is None:
        pytest.skip("the native library is not built")
    model, inputs, dynamic = _llama_with("lm_head", np.nan)
    assert kernel in _variants(model, inputs, backend, tmp_path, dynamic)
    assert not _variants(model, inputs, "onnxruntime-standard", tmp_path, dynamic)


def test_the_block_runs_the_fused_kernels(tmp_path):
    """The Block cases below exercise ORT's elementwise and norm contrib kernels."""
    gen = torch.Generator().manual_seed(1)
    inputs = tuple(torch.randn(2, 3, 16, generator=gen) for _ in "xr")
    assert {"com.microsoft.FusedMatMul", "com.microsoft.Gelu", "com.microsoft.FastGelu",
            "com.microsoft.QuickGelu", "com.microsoft.SkipLayerNormalization"} <= \
        _variants(Block().eval(), inputs, "onnxruntime", tmp_path)
    assert "com.microsoft.MultiHeadAttention" in _variants(
        Attention(False), tuple(_attention_inputs()), "onnxruntime", tmp_path)
    # causal attention is never given to MultiHeadAttention (it adds its causal mask)
    assert "com.microsoft.MultiHeadAttention" not in _variants(
        Attention(True), tuple(_attention_inputs()), "onnxruntime", tmp_path)


# --- small graphs with float inputs -------------------------------------------------------------

class Attention(nn.Module):
    """Causal (or not) attention on q, k, v [batch, heads, seq, size]."""

    def __init__(self, causal: bool):
        super().__init__()
        self.causal = causal

    def forward(self, q, k, v):
        return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


class Block(nn.Module):
    """The elementwise and norm kernels ORT fuses: x @ W (3-D: FusedMatMul), gelu (Gelu),
    tanh-gelu (FastGelu), silu (QuickGelu), residual + layer norm (SkipLayerNormalization)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(16, 16, bias=False), nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x, r):
        h = self.a(x) * nn.functional.gelu(x + r) + nn.functional.gelu(x - r, approximate="tanh")
        h = self.b(h) * nn.functional.silu(x * r)
        return self.norm(h + r)


def _attention_inputs(seq: int = 7):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(2, 4, seq, 8, generator=gen) for _ in "qkv"]


@pytest.mark.parametrize("backend", BACKENDS + ["onnxruntime-standard"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("tensor, index, value", [
    (0, (1, 2, 3, 5), np.nan),     # q: one row of one head
    (0, (0, 1, 0, 0), -np.inf),    # q: -Inf times keys of both signs: +-Inf scores, NaN row
    (2, (1, 3, 4, 2), np.nan),     # v: one channel of every row (0 * NaN in the masked ones)
    (2, (0, 0, 6, 0), np.inf),     # v: Inf in the last token
])
def test_attention_with_a_nonfinite_input(backend, causal, tensor, index, value, tmp_path):
    inputs = _attention_inputs()
    inputs[tensor][index] = value
    model = Attention(causal)
    want = eager(model, inputs)
    assert not np.isfinite(want[0]).all() and np.isfinite(want[0]).any()
    assert_like_eager(compile_and_run(model, tuple(inputs), backend, tmp_path), want)


@pytest.mark.parametrize("backend", BACKENDS + ["onnxruntime-standard"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_attention_with_a_nonfinite_key(backend, causal, value, tmp_path):
    """A NaN or Inf in key 4 of 7 reaches the rows that see it and, under is_causal, not the
    rows before it: torch's default is_causal kernel replaces hidden scores by -inf (its math
    backend adds the mask, NaN + -inf, and makes every row NaN). Every lowering dayzero picks
    follows the default kernel: ORT's MultiHeadAttention is not picked for causal attention."""
    inputs = _attention_inputs()
    inputs[1][1, 2, 4, 3] = value
    model = Attention(causal)
    # the default kernel named, not left to dispatch: global state set by other tests (or a
    # torch without the CPU flash kernel) would make it the math backend
    with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        want = [model(*inputs).numpy()]
    rows = np.isnan(want[0][1, 2]).any(-1)
    if value != value:  # NaN: every row that sees key 4
        assert rows.tolist() == [not causal] * 4 + [True] * 3
    if causal:  # rows 0-3 do not see it; an Inf key gives NaN or weight 0 by q's sign
        assert np.isfinite(want[0][1, 2, :4]).all() and rows.any()
    assert_like_eager(compile_and_run(model, tuple(inputs), backend, tmp_path), want)


@pytest.mark.parametrize("backend", BACKENDS + ["onnxruntime-standard"])
@pytest.mark.parametrize("tensor, index, value", [
    (0, (0, 1, 3), np.nan), (0, (1, 0, 2), np.inf), (0, (0, 2, 0), -np.inf),
    (1, (1, 2, 7), np.nan), (1, (0, 0, 4), -np.inf),
])
def test_block_with_a_nonfinite_input(backend, tensor, index, value, tmp_path):
    gen = torch.Generator().manual_seed(1)
    inputs = [torch.randn(2, 3, 16, generator=gen) for _ in "xr"]
    inputs[tensor][index] = value
    model = Block().eval()
    want = eager(model, inputs)
    assert not np.isfinite(want[0]).all() and np.isfinite(want[0]).any()
    assert_like_eager(compile_and_run(model, tuple(inputs), backend, tmp_path), want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mlp_example_with_nan_and_inf_inputs(backend, tmp_path):
    model, (x,), dynamic = build("mlp")
    x = x.clone()
    x[1, 3], x[2, 0] = np.nan, np.inf
    want = eager(model, (x,))
    assert np.isnan(want[0][1]).all() and np.isfinite(want[0][0]).all()
    assert_like_eager(compile_and_run(model, (x,), backend, tmp_path, dynamic), want)


# --- each fused ONNX Runtime kernel as a small IR graph, against the reference interpreter -----

CONTRIB_CASES = {  # case in tests/backends/onnxruntime_cases.py -> the variant it lowers to
    "linear": "com.microsoft.FusedMatMul",
    "gelu": "com.microsoft.Gelu",
    "gelu_tanh": "com.microsoft.FastGelu",
    "silu": "com.microsoft.QuickGelu",
    "add_rms_norm": "com.microsoft.SkipSimplifiedLayerNormalization",
    "add_layer_norm": "com.microsoft.SkipLayerNormalization",
    "quantized_linear_int4": "com.microsoft.MatMulNBits",
    "quantized_linear_int8": "com.microsoft.MatMulNBits",
    "quantized_linear_int4_int8": "ai.dayzero.MatMulInt4",
    "sdpa_float_mask": "com.microsoft.MultiHeadAttention",
    "multi_head_attention_padding": "com.microsoft.MultiHeadAttention",
    "multi_head_attention_plain_gqa": "ai.dayzero.CausalAttention",
    "multi_head_attention_gqa": "ai.dayzero.CausalAttention",
    "paged_attention": "ai.dayzero.PagedAttention",
    "paged_attention_window": "ai.dayzero.PagedAttention",
}


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name", sorted(CONTRIB_CASES))
def test_each_fused_ort_kernel_with_a_nonfinite_input(name, value, tmp_path):
    """A NaN or Inf in each float input the kernel reads (q and v for attention: a non-finite
    key after a row is masked out by the causal kernels and added by MultiHeadAttention, see
    docs/backends.md), at one position; the outputs against the reference interpreter."""
    from backends.onnxruntime import native_ops
    from backends.reference.interpreter import run_graph
    from tests.backends.onnxruntime_cases import CASES
    from tests.backends.onnxruntime_util import compile_graph, load
    from tests.backends.test_onnxruntime_ops import build as build_graph
    from tests.backends.test_onnxruntime_ops import inputs_for

    if CONTRIB_CASES[name].startswith("ai.dayzero") and native_ops.library() is None:
        pytest.skip("the native library is not built")
    case = CASES[name]
    g = build_graph(case)
    path = compile_graph(g, tmp_path / "m.dz")
    variants = json.loads((path / "backend" / "lowering.json").read_text())["variants"]
    assert CONTRIB_CASES[name] in variants
    run = load(path)
    base = inputs_for(g, case, 9, 0)
    targets = [i for i, v in enumerate(g.inputs)
               if v.type.dtype.is_float and v.name not in ("k", "f", "m")]
    assert targets
    for i in targets:
        x = [a.copy() for a in base]
        x[i].reshape(-1)[x[i].size // 3] = value
        want = [w.numpy() for w in run_graph(g, g.weight_data, [torch.from_numpy(a) for a in x])]
        assert not all(np.isfinite(w).all() for w in want)
        if name == "gelu" and value == np.inf and _torch_gelu_of_inf_is_nan():
            # torch's AVX-512 erf-gelu returns NaN for +inf (its AVX2 path and the math give
            # +inf, as ORT's Gelu does): eager itself depends on the CPU at this one value
            want[0].reshape(-1)[x[i].size // 3] = np.inf
        assert_like_eager(run(x), want)


def _torch_gelu_of_inf_is_nan() -> bool:
    return bool(torch.isnan(nn.functional.gelu(torch.full((64,), float("inf")))).any())
