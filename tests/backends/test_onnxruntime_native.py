"""dayzero's native ONNX Runtime kernel, ai.dayzero.CausalAttention, run as one-node ONNX models
against a NumPy reference; its error messages; and what happens where the library is missing."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from backends.onnxruntime import native_ops
from backends.onnxruntime.session import SessionConfig, session_options

F = TensorProto.FLOAT


def test_the_library_is_built():
    assert native_ops.library() is not None, (
        "backends/onnxruntime/_dayzero_ort_ops*.so is missing or does not load: "
        "`pip install -e .` builds it with the C++ compiler (see setup.py)")


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    """x [b, s, h, d] rotated by cache rows 0..s-1 over its first 2 * cos.shape[1] channels."""
    half = cos.shape[1]
    c, s = cos[: x.shape[1], None, :], sin[: x.shape[1], None, :]
    out = x.copy()
    if interleaved:
        a, b = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
        out[..., 0:2 * half:2], out[..., 1:2 * half:2] = a * c - b * s, b * c + a * s
    else:
        a, b = x[..., :half], x[..., half:2 * half]
        out[..., :half], out[..., half:2 * half] = a * c - b * s, b * c + a * s
    return out


def reference(q, k, v, cos, sin, heads, kv_heads, scale, interleaved=False):
    """Causal attention in float64: q [b, s, heads * d], k and v [b, s, kv_heads * d]."""
    b, s, _ = q.shape
    size = q.shape[-1] // heads
    q, k, v = (x.astype(np.float64).reshape(b, s, -1, size) for x in (q, k, v))
    if cos is not None:
        q, k = rotate(q, cos, sin, interleaved), rotate(k, cos, sin, interleaved)
    group = heads // kv_heads
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and Inf propagate, as in torch
        scores = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
        scores[:, :, np.triu_indices(s, 1)[0], np.triu_indices(s, 1)[1]] = -np.inf
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        return np.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, heads * size)


def one_node(names: list[str], **attrs):
    """A model of one CausalAttention node on inputs `names` ("" for an absent one)."""
    node = helper.make_node("CausalAttention", names, ["out"], domain=native_ops.DOMAIN, **attrs)
    inputs = [helper.make_tensor_value_info(n, F, None) for n in names if n]
    graph = helper.make_graph([node], "causal", inputs,
                              [helper.make_tensor_value_info("out", F, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                   helper.make_opsetid(native_ops.DOMAIN, 1)])


def model(heads: int, kv_heads: int, packed: bool, rotary: bool, **attrs):
    names = ["qkv" if packed else "q", "" if packed else "k", "" if packed else "v",
             "cos" if rotary else "", "sin" if rotary else ""]
    return one_node(names, num_heads=heads, kv_num_heads=kv_heads, **attrs)


def session(onnx_model, threads: int = 2) -> ort.InferenceSession:
    options = session_options(SessionConfig(intra_op_threads=threads, allow_spinning=False))
    return ort.InferenceSession(onnx_model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def tables(rows: int, half: int) -> tuple[np.ndarray, np.ndarray]:
    angles = np.arange(rows)[:, None] / 10000.0 ** (np.arange(half) / half)[None]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


CASES = [  # batch, seq, heads, kv_heads, head_size, packed, rotary ("", halves, pairs, part)
    (1, 128, 8, 4, 32, True, "halves"),   # the benchmark decoder's layer
    (1, 1, 8, 4, 32, True, "halves"),     # a single token
    (2, 17, 4, 2, 16, False, "halves"),   # a partial last block, batch 2
    (3, 16, 4, 4, 64, False, ""),         # MHA, no rotary, one full block
    (1, 33, 6, 1, 32, True, "pairs"),     # MQA, interleaved rotary
    (1, 300, 2, 1, 64, True, "part"),     # rotary on half the channels; several key runs
    (1, 20, 4, 2, 8, True, "halves"),     # head size 8: the scalar path
    (2, 21, 3, 3, 24, False, "pairs"),    # head size 24: the scalar path
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch, seq, heads, kv_heads, size, packed, rotary", CASES)
def test_matches_reference(batch, seq, heads, kv_heads, size, packed, rotary, threads):
    rng = np.random.default_rng(seq + size)
    q = rng.standard_normal((batch, seq, heads * size), dtype=np.float32)
    k, v = (rng.standard_normal((batch, seq, kv_heads * size), dtype=np.float32) for _ in "kv")
    half = {"": 0, "halves": size // 2, "pairs": size // 2, "part": size // 4}[rotary]
    cos, sin = tables(seq + 5, half) if rotary else (None, None)
    scale = 0.3
    feeds = {"qkv": np.concatenate([q, k, v], -1)} if packed else {"q": q, "k": k, "v": v}
    if rotary:
        feeds.update(cos=cos, sin=sin)
    onnx_model = model(heads, kv_heads, packed, bool(rotary), scale=scale,
                       rotary_interleaved=int(rotary == "pairs"))
    got = session(onnx_model, threads).run(None, feeds)[0]
    want = reference(q, k, v, cos, sin, heads, kv_heads, scale, rotary == "pairs")
    assert got.shape == (batch, seq, heads * size)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_default_scale_and_large_scores():
    """No scale attribute: 1 / sqrt(head_size). Scores in the thousands stay finite (the softmax
    subtracts each row's maximum). float32 rounds such scores by about 3e-4, which the softmax
    passes on, so the bound is relative to the values' size (30): 2e-3 absolute."""
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 40, 4 * 32), dtype=np.float32) * 30
    k, v = (rng.standard_normal((1, 40, 2 * 32), dtype=np.float32) * 30 for _ in "kv")
    got = session(model(4, 2, False, False)).run(None, {"q": q, "k": k, "v": v})[0]
    want = reference(q, k, v, None, None, 4, 2, 32 ** -0.5)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-3)


@pytest.mark.parametrize("attrs, feeds, message", [
    (dict(num_heads=3, kv_num_heads=2), dict(qkv=(1, 4, 56)),
     "num_heads a multiple of kv_num_heads"),
    (dict(num_heads=4, kv_num_heads=2), dict(qkv=(1, 4, 50)),
     "query's last dim 50 is not a multiple of 8 heads"),
    (dict(num_heads=4, kv_num_heads=2), dict(q=(1, 4, 64), k=(1, 4, 32), v=(1, 5, 32)),
     r"key and value must be \[batch, seq, kv_num_heads \* head_size\] = \[1, 4, 32\]"),
    (dict(num_heads=4, kv_num_heads=2), dict(qkv=(1, 4, 128), cos=(3, 8), sin=(3, 8)),
     "the rotary tables have fewer rows than tokens"),
    (dict(num_heads=4, kv_num_heads=2), dict(qkv=(1, 4, 128), cos=(8, 9), sin=(8, 9)),
     "the rotary tables are wider than half a head"),
    (dict(num_heads=4, kv_num_heads=2), dict(qkv=(4, 128)), r"query must be \[batch, seq"),
    # attributes whose sums overflowed (num_heads + 2 * kv_num_heads was -64) are refused
    (dict(num_heads=2 ** 62, kv_num_heads=2 ** 61), dict(qkv=(1, 4, 64)),
     "num_heads a multiple of kv_num_heads and at most 1024"),
    (dict(num_heads=2048, kv_num_heads=1), dict(qkv=(1, 2, 2050)), "at most 1024"),
    (dict(num_heads=4, kv_num_heads=2, rotary_interleaved=2), dict(qkv=(1, 4, 64)),
     "rotary_interleaved must be 0 or 1"),
    (dict(num_heads=4, kv_num_heads=2, scale=float("nan")), dict(qkv=(1, 4, 64)),
     "scale must be finite"),
    # shapes the kernel cannot run are refused before ORT allocates the output
    (dict(num_heads=1, kv_num_heads=1), dict(q=(1, 2, 1040), k=(1, 2, 1040), v=(1, 2, 1040)),
     "the head size must be 1 to 1024"),
    (dict(num_heads=4, kv_num_heads=2), dict(qkv=(1, 4, 0)), "query's last dim 0"),
    (dict(num_heads=4, kv_num_heads=2), dict(qkv=(1, 1, 4, 64)),
     "input 0 has rank 4; expected 2 or 3"),
])
def test_bad_input_is_named(attrs, feeds, message):
    names = ["qkv" if "qkv" in feeds else "q"] + [n if n in feeds else ""
                                                   for n in ("k", "v", "cos", "sin")]
    arrays = {n: np.zeros(shape, np.float32) for n, shape in feeds.items()}
    with pytest.raises(Exception, match=f"CausalAttention: .*{message}"):
        session(one_node(names, **attrs)).run(None, arrays)


def test_without_the_library_attention_falls_back_and_artifacts_run_their_portable_model(
        monkeypatch, tmp_path):
    from backends.onnxruntime.fused import ContribFallbackWarning
    from backends.onnxruntime.probe import installed_kernels
    from backends.reference.interpreter import run_graph
    from compiler.ir import Graph
    from tests.backends.onnxruntime_cases import CASES as GRAPHS
    from tests.backends.onnxruntime_util import compile_graph, load

    g = Graph("gqa")
    g.symbols["s0"] = (1, 64)
    g.outputs = GRAPHS["multi_head_attention_gqa"].build(g)
    native = compile_graph(g, tmp_path / "native.dz")
    monkeypatch.setattr(native_ops, "library", lambda: None)
    installed_kernels.cache_clear()
    try:
        with pytest.warns(ContribFallbackWarning,
                          match="ai.dayzero.CausalAttention kernel is missing"):
            fallback = compile_graph(g, tmp_path / "fallback.dz")
        ops = (fallback / "backend" / "lowering.json").read_text()
        assert "com.microsoft.GroupQueryAttention" in ops and "CausalAttention" not in ops
        rng = np.random.default_rng(0)
        x = [rng.standard_normal([d if isinstance(d, int) else 6
                                  for d in v.shape]).astype(np.float32) for v in g.inputs]
        np.testing.assert_allclose(load(fallback)(x)[0], run_graph(g, {}, x)[0].numpy(),
                                   rtol=1e-5, atol=1e-5)
        with pytest.warns(native_ops.PortableFallbackWarning,
                          match="ai.dayzero.CausalAttention are not available"):
            portable = load(native)  # the artifact's portable model, GroupQueryAttention
        np.testing.assert_allclose(portable(x)[0], run_graph(g, {}, x)[0].numpy(),
                                   rtol=1e-5, atol=1e-5)
    finally:
        installed_kernels.cache_clear()


def test_runs_without_torch(tmp_path):
    """An artifact using the native kernel loads and runs where importing torch fails: the
    library is registered by the load path, which needs only numpy and onnxruntime."""
    import json
    import subprocess
    import sys
    import textwrap

    from backends.reference.interpreter import run_graph
    from compiler.ir import Graph
    from tests.backends.onnxruntime_cases import CASES as GRAPHS
    from tests.backends.onnxruntime_util import compile_graph
    from tests.backends.test_onnxruntime import BLOCK_TORCH

    g = Graph("gqa")
    g.symbols["s0"] = (1, 64)
    g.outputs = GRAPHS["multi_head_attention_gqa"].build(g)
    path = compile_graph(g, tmp_path / "m.dz")
    assert "ai.dayzero.CausalAttention" in json.loads(
        (path / "backend" / "lowering.json").read_text())["variants"]
    rng = np.random.default_rng(7)
    x = [rng.standard_normal([d if isinstance(d, int) else 9 for d in v.shape])
         .astype(np.float32) for v in g.inputs]
    np.savez(tmp_path / "x.npz", *x)
    code = BLOCK_TORCH + textwrap.dedent(f"""
        import numpy as np, runtime
        x = np.load({str(tmp_path / "x.npz")!r})
        (y,) = runtime.load({str(path)!r})(*[x[f"arr_{{i}}"] for i in range(len(x.files))])
        np.save({str(tmp_path / "y.npy")!r}, y)
        assert not [k for k in sys.modules if k.split(".")[0] == "torch"]
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), run_graph(g, {}, x)[0].numpy(),
                               rtol=1e-5, atol=1e-5)


# Non-finite inputs. The float64 reference is the dense computation torch eager does: a NaN or
# Inf score makes its row NaN (Inf - Inf in the softmax), a -Inf score weighs 0, and a NaN or
# Inf in v reaches every row, the rows that mask it too (0 * Inf and 0 * NaN are NaN).
NONFINITE_LAYOUTS = {  # heads, kv_heads, head_size, packed, rotary
    "avx2": (4, 2, 32, True, "halves"),
    "avx2-norotary": (4, 2, 16, False, ""),
    "scalar": (4, 2, 24, False, "pairs"),
    "scalar-norotary": (2, 1, 8, True, ""),
}
NONFINITE_CASES = [  # tensor, token, channel, value
    ("k", 20, 3, np.nan),   # rows 20..36 of the group's heads: 17 NaN rows
    ("q", 20, 3, np.nan),   # row 20 of one head
    ("v", 20, 3, np.nan),   # every row of the group's heads, channel 3
    ("v", 0, 5, np.nan),
    ("v", 36, 0, np.inf),   # the last token: rows 0..35 mask it, 0 * Inf = NaN
    ("v", 7, 2, -np.inf),
    ("k", 9, 1, np.inf),
    ("q", 16, 0, -np.inf),
    ("k", 0, 0, np.nan),    # the first key: every row
]


def _nonfinite_feeds(layout: str, seq: int = 37):
    heads, kv_heads, size, packed, rotary = NONFINITE_LAYOUTS[layout]
    rng = np.random.default_rng(size)
    q = rng.standard_normal((2, seq, heads * size), dtype=np.float32)
    k, v = (rng.standard_normal((2, seq, kv_heads * size), dtype=np.float32) for _ in "kv")
    cos, sin = tables(seq, size // 2) if rotary else (None, None)
    return heads, kv_heads, packed, rotary, q, k, v, cos, sin


def _run_nonfinite(layout, q, k, v, cos, sin, threads=2):
    heads, kv_heads, _, packed, rotary = NONFINITE_LAYOUTS[layout]
    feeds = {"qkv": np.concatenate([q, k, v], -1)} if packed else {"q": q, "k": k, "v": v}
    if rotary:
        feeds.update(cos=cos, sin=sin)
    onnx_model = model(heads, kv_heads, packed, bool(rotary), scale=0.3,
                       rotary_interleaved=int(rotary == "pairs"))
    got = session(onnx_model, threads).run(None, feeds)[0]
    want = reference(q, k, v, cos, sin, heads, kv_heads, 0.3, rotary == "pairs")
    return got, want


def assert_same_nonfinite(got: np.ndarray, want: np.ndarray) -> None:
    """NaN exactly where the reference has NaN, the same infinities, finite values close."""
    np.testing.assert_array_equal(np.argwhere(np.isnan(got)), np.argwhere(np.isnan(want)))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", sorted(NONFINITE_LAYOUTS))
@pytest.mark.parametrize("tensor, token, channel, value", NONFINITE_CASES)
def test_nonfinite_inputs_propagate_like_the_reference(layout, tensor, token, channel, value):
    heads, kv_heads, packed, rotary, q, k, v, cos, sin = _nonfinite_feeds(layout)
    {"q": q, "k": k, "v": v}[tensor][1, token, channel] = value
    got, want = _run_nonfinite(layout, q, k, v, cos, sin)
    assert np.isnan(want).any() or np.isinf(want).any() or tensor != "v"
    assert_same_nonfinite(got, want)
    if (tensor, token) == ("k", 20):  # the case: a NaN key poisons rows 20..36
        assert np.isnan(got[1]).any(-1).nonzero()[0].tolist() == list(range(20, 37))


@pytest.mark.parametrize("layout", ["avx2-norotary", "scalar-norotary"])
def test_minus_inf_scores(layout):
    """A -Inf score weighs 0 and the row stays finite; a row whose every visible score is -Inf
    is NaN (softmax of all -Inf), and +Inf scores make their rows NaN (Inf - Inf)."""
    heads, kv_heads, packed, rotary, q, k, v, cos, sin = _nonfinite_feeds(layout)
    size = NONFINITE_LAYOUTS[layout][2]
    q[..., ::size] = -np.abs(q[..., ::size]) - 0.1  # channel 0 of every head negative
    k[0, 5, 0] = np.inf      # batch 0: key 5 scores -Inf in the group's heads, rows 5..
    k[1, :, 0] = np.abs(k[1, :, 0]) + 0.1
    q[1, 9, 0] = -np.inf     # batch 1, head 0, row 9: every score -Inf
    q[1, 11, size] = np.inf  # batch 1, head 1, row 11: every score +Inf
    got, want = _run_nonfinite(layout, q, k, v, cos, sin)
    assert np.isfinite(want[0]).all()
    assert np.isnan(want[1, 9, :size]).all() and np.isnan(want[1, 11, size:2 * size]).all()
    assert_same_nonfinite(got, want)


def test_the_limits_match_the_fit_check():
    """convert_heads refuses at compile time what the kernel refuses at run time."""
    import re
    from pathlib import Path

    from backends.onnxruntime import convert_heads

    header = (Path(native_ops.__file__).parent / "native" / "causal_attention.h").read_text()

    def constant(name):
        expr = re.search(rf"constexpr int64_t {name} = ([^;]+);", header).group(1)
        return eval(re.sub(r"int64_t\{(\d+)\}", r"\1", expr))

    assert convert_heads.CAUSAL_MAX_HEAD_SIZE == constant("kMaxHeadSize") == 1024
    assert convert_heads.CAUSAL_MAX_HEADS == constant("kMaxHeads")
    assert convert_heads.CAUSAL_MAX_SEQUENCE == constant("kMaxSequence")


def _library():
    import ctypes

    return ctypes.CDLL(str(native_ops.library_file()))


def test_large_scratch_is_released_after_the_call():
    """A call that needs 16 MB of packed k and v does not leave it held by the thread."""
    import ctypes

    lib = _library()  # the library ONNX Runtime loaded: dlopen returns the same one
    lib.DayzeroRetainedScratchBytes.restype = ctypes.c_int64
    small = session(model(4, 4, False, False), threads=1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 8, 4 * 64), dtype=np.float32)
    small.run(None, {"q": x, "k": x, "v": x})
    before = lib.DayzeroRetainedScratchBytes()
    assert 0 < before < 1 << 20
    x = rng.standard_normal((32, 256, 4 * 64), dtype=np.float32)  # packed: 2 x 8 MB
    got = small.run(None, {"q": x, "k": x, "v": x})[0]
    assert np.isfinite(got).all()
    assert lib.DayzeroRetainedScratchBytes() < 1 << 20


def test_refuses_an_older_onnxruntime_by_name():
    """RegisterCustomOps against an ApiBase that serves only API versions before 17 returns an
    error status (made through the version-1 table) naming the versions, and calls nothing else."""
    import ctypes

    lib = _library()
    messages = []
    create_type = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)
    create = create_type(lambda code, text: messages.append((code, text.decode())) or 0x5eed)
    table = (ctypes.c_void_p * 1)(ctypes.cast(create, ctypes.c_void_p).value)
    asked = []
    get_api_type = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_uint32)
    get_api = get_api_type(
        lambda version: asked.append(version) or (ctypes.addressof(table) if version < 17
                                                  else None))
    version_text = ctypes.create_string_buffer(b"1.16.3")
    version_type = ctypes.CFUNCTYPE(ctypes.c_void_p)
    version = version_type(lambda: ctypes.addressof(version_text))
    base = (ctypes.c_void_p * 2)(ctypes.cast(get_api, ctypes.c_void_p).value,
                                 ctypes.cast(version, ctypes.c_void_p).value)
    lib.RegisterCustomOps.restype = ctypes.c_void_p
    lib.RegisterCustomOps.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    assert lib.RegisterCustomOps(None, ctypes.addressof(base)) == 0x5eed
    assert asked == [17, 1]
    ((code, text),) = messages
    assert code == 1  # ORT_FAIL
    assert "API version 17" in text and "1.17" in text and "found ONNX Runtime 1.16.3" in text


def test_the_fit_check_refuses_what_the_kernel_refuses():
    """A head size over 1024 compiled onto CausalAttention and then failed on every call; now
    the fit check refuses it (and GroupQueryAttention, without the limit, takes the node)."""
    from backends.onnxruntime import convert_heads
    from compiler.ir import Graph
    from tests.backends.onnxruntime_cases import _multi_head

    def node(size: int):
        g = Graph("big")
        (out,) = _multi_head(rotary=False, causal=True, size=size)(g)
        return out.producer

    assert convert_heads.causal_fits(node(1024)) is None
    assert convert_heads.causal_fits(node(1040)) == "CausalAttention takes head sizes up to 1024"
    assert convert_heads.gqa_fits(node(1040)) is None


def test_an_explicit_scale_of_zero_is_not_read_as_the_default():
    """The attention kernels (CausalAttention, GQA, MHA) read scale 0 as 1 / sqrt(head_size);
    a node with scale 0 (uniform weights in eager) fits none of them."""
    from backends.onnxruntime import convert_attention, convert_heads
    from compiler.ir import Graph
    from tests.backends.onnxruntime_cases import CASES as GRAPHS

    for name, fits in [("multi_head_attention_plain_gqa", convert_heads.causal_fits),
                       ("multi_head_attention_plain_gqa", convert_heads.gqa_fits),
                       ("multi_head_attention_bool_mask", convert_heads.mha_fits),
                       ("sdpa", convert_attention.mha_fits)]:
        g = Graph("scale")
        (out,) = GRAPHS[name].build(g)
        assert fits(out.producer) is None, name
        out.producer.attrs["scale"] = 0.0
        assert "scale 0" in fits(out.producer), name


def test_out_of_memory_is_an_error_status_not_a_crash():
    """With the address space capped just above what ONNX Runtime needs for the output, the
    kernel's packed k and v (twice the key bytes) cannot be allocated: the call fails with the
    kernel's own message, and the process goes on to run the next call. Run in a subprocess,
    since the cap is process-wide."""
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    code = textwrap.dedent(f"""
        import resource, sys
        import numpy as np
        sys.path.insert(0, {root!r})
        from tests.backends.test_onnxruntime_native import model, session
        s = session(model(8, 8, False, False), threads=1)
        x = np.ones((1, 16384, 8 * 128), np.float32)  # 64 MB each; packed k and v: 128 MB
        small = np.ones((1, 4, 8 * 128), np.float32)
        s.run(None, {{"q": small, "k": small, "v": small}})
        page = resource.getpagesize()
        with open("/proc/self/statm") as f:
            used = int(f.read().split()[0]) * page
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (used + x.nbytes + (48 << 20), hard))
        try:
            s.run(None, {{"q": x, "k": x, "v": x}})
            print("RAN")
        except Exception as e:
            print("ERROR", e)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        out = s.run(None, {{"q": small, "k": small, "v": small}})[0]
        print("NEXT", out.shape, bool(np.isfinite(out).all()))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ERROR" in result.stdout and "out of memory" in result.stdout, result.stdout
    assert "NEXT (1, 4, 1024) True" in result.stdout
