"""dayzero's onnxruntime artifact against the tools a user would pick instead, side by side.

For each workload, in one process and on the same inputs: PyTorch eager, torch.compile
(Inductor), torch.onnx.export + ONNX Runtime, torch.onnx.export + ONNX Runtime's transformer
optimizer (`onnxruntime.transformers.optimizer.optimize_model`) + ONNX Runtime, dayzero's
artifact via runtime.load, and the same artifact compiled without dayzero's native kernels
(`exclude_kernels: [ai.dayzero.CausalAttention]`), so the compiler's share and the hand-written
kernel's share show apart. Every ORT session gets exactly dayzero's session options.

Prints median latency, ratios to eager and to the best peer (the fastest that is not dayzero),
the largest difference from eager, compile time (model to loaded executable) measured cold in a
fresh subprocess per peer and warm in this process, and the roofline floor: the model's matmul
FLOPs (causal attention counted as the S(S+1)/2 pairs it needs) divided by this machine's
measured fp32 GEMM rate.

    python benchmarks/peers.py                       # every workload
    python benchmarks/peers.py --workloads decoder-128 --repeat 50

torch.onnx.export needs the `onnxscript` package (pip install onnxscript); without it both
exporter peers are reported as unavailable, as is the optimizer peer when
onnxruntime.transformers cannot be imported. This is a script, not a test: timings depend on
the machine; its bookkeeping (rounds, pairing, FLOP counting, the floor) is tested in
tests/benchmarks/test_peers_harness.py.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import compiler  # noqa: E402
import runtime  # noqa: E402
from backends.onnxruntime.ort_module import ort  # noqa: E402,F401 - telemetry off (issue 33)
from backends.onnxruntime.session import SessionConfig, create_session  # noqa: E402
from compiler.ir import parse_ir  # noqa: E402
from compiler.ir.symbolic import evaluate  # noqa: E402


def _example(name: str):
    path = ROOT / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- workloads ----------------------------------------------------------------------------------

def decoder(seq: int):
    """examples/llama.py:build_bench (4 layers, hidden 256, 8 heads, 4 KV heads), batch 1."""
    model, (ids,), dynamic = _example("llama").build_bench()
    ids = torch.randint(0, 1000, (1, seq), generator=torch.Generator().manual_seed(seq))
    return model, (ids,), dynamic


def encoder(seq: int = 128):
    """BERT-style encoder: 4 layers, hidden 256, 4 heads, intermediate 1024, batch 1."""
    from transformers import BertConfig, BertModel

    bert = _example("bert")
    cfg = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                     intermediate_size=1024, vocab_size=1000, max_position_embeddings=512,
                     attn_implementation="sdpa")
    torch.manual_seed(0)
    model = bert.Encoder(BertModel(cfg, add_pooling_layer=False).eval())
    ids = torch.randint(0, 1000, (1, seq), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(1, seq, dtype=torch.int64)
    dim = torch.export.Dim("seq", min=2, max=512)
    return model, (ids, mask), ({1: dim}, {1: dim})


def vit():
    """ViT: 224x224 images, 16x16 patches (197 tokens), 4 layers, hidden 256, 8 heads, batch 1."""
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                    intermediate_size=1024, image_size=224, patch_size=16,
                    attn_implementation="sdpa")
    torch.manual_seed(0)
    model = _example("vit").Encoder(ViTModel(cfg, add_pooling_layer=False).eval())
    pixels = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    return model, (pixels,), None  # static: torch.export specializes a batch of 1


WORKLOADS: dict[str, Callable] = {
    "decoder-128": lambda: decoder(128),
    "decoder-512": lambda: decoder(512),
    "encoder-128": encoder,
    "vit-224": vit,
}

# optimize_model's arguments per workload: (model_type, num_heads, hidden_size). The decoder is
# Llama-style (RoPE, GQA, RMSNorm): "qwen3" is the optimizer's type for that family where the
# installed onnxruntime has it, else "gpt2", its generic decoder type.
OPTIMIZER_ARGS: dict[str, tuple[tuple[str, ...], int, int]] = {
    "decoder-128": (("qwen3", "gpt2"), 8, 256),
    "decoder-512": (("qwen3", "gpt2"), 8, 256),
    "encoder-128": (("bert",), 4, 256),
    "vit-224": (("vit",), 8, 256),
}

NATIVE_KERNEL = "ai.dayzero.CausalAttention"

# what each attention kernel computes of a causal score matrix (printed with the floor)
ATTENTION_KERNELS = {
    NATIVE_KERNEL: "skips the masked half (blocks of 16 queries times the keys they may see; "
                   "the diagonal blocks are computed whole)",
    "com.microsoft.GroupQueryAttention": "computes the full S x S scores, then masks",
    "com.microsoft.MultiHeadAttention": "computes the full S x S scores, then masks",
    "com.microsoft.Attention": "computes the full S x S scores, then masks",
}


# -- measurement --------------------------------------------------------------------------------

@dataclass
class Peer:
    """One way of running the model: how long it took to get ready, and a call to time."""

    name: str
    compile_s: float | None = None
    run: Callable[[], object] | None = None
    output: np.ndarray | None = None
    note: str = ""
    times: list[float] = field(default_factory=list)
    cpu_times: list[float] = field(default_factory=list)
    rounds: list[float] = field(default_factory=list)  # median call of each round's block
    extra: dict = field(default_factory=dict)
    cold_compile_s: float | None = None  # in a fresh subprocess (cold_compile)
    dayzero: bool = False  # one of dayzero's own rows, never "the best peer"

    @property
    def latency_ms(self) -> float | None:
        return statistics.median(self.times) * 1e3 if self.times else None

    @property
    def best_ms(self) -> float | None:
        return min(self.times) * 1e3 if self.times else None

    @property
    def cpu_ms(self) -> float | None:
        """CPU time of all the process's threads per call, averaged over each block of
        back-to-back calls (spinning between calls included); the median over the blocks."""
        return statistics.median(self.cpu_times) * 1e3 if self.cpu_times else None


def _first(out) -> np.ndarray:
    if isinstance(out, (tuple, list)):
        out = out[0]
    return out.detach().numpy() if isinstance(out, torch.Tensor) else np.asarray(out)


def eager_peer(model, inputs) -> Peer:
    run = lambda: model(*inputs)
    return Peer("eager", 0.0, run, _first(run()))


def compile_peer(model, inputs) -> Peer:
    torch._dynamo.reset()
    start = time.perf_counter()
    compiled = torch.compile(model)
    out = _first(compiled(*inputs))
    return Peer("torch.compile", time.perf_counter() - start, lambda: compiled(*inputs), out)


def dynamo_peer(model, inputs) -> Peer:
    """torch.compile with dayzero as its backend: dynamo's graph through dayzero's compile
    (the disk cache off, so that the compile is measured)."""
    torch._dynamo.reset()
    start = time.perf_counter()
    compiled = torch.compile(model, backend="dayzero", options={"cache": False})
    out = _first(compiled(*inputs))
    return Peer("torch.compile(backend=dayzero)", time.perf_counter() - start,
                lambda: compiled(*inputs), out, dayzero=True)


def _export(model, inputs, dynamic, path: Path) -> None:
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model, inputs, str(path), dynamo=True, dynamic_shapes=dynamic,
                          verbose=False)


def _ort_peer(name: str, onnx_bytes: bytes, inputs, workdir: Path, session: dict,
              start: float, **extra) -> Peer:
    session = create_session(onnx_bytes, SessionConfig(**session), workdir)
    took = time.perf_counter() - start
    feeds = {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs)}
    run = lambda: session.run(None, feeds)
    return Peer(name, took, run, _first(run()), extra=extra)


def onnx_export_peer(model, inputs, dynamic, workdir: Path, session: dict) -> Peer:
    name = "torch.onnx.export+ORT"
    try:
        import onnxscript  # noqa: F401
    except ImportError:
        return Peer(name, note="unavailable: pip install onnxscript")
    path = workdir / "exported.onnx"
    start = time.perf_counter()
    _export(model, inputs, dynamic, path)
    return _ort_peer(name, path.read_bytes(), inputs, workdir, session, start)


def optimizer_peer(model, inputs, dynamic, workdir: Path, session: dict,
                   args: tuple[tuple[str, ...], int, int]) -> Peer:
    """torch.onnx.export, then ONNX Runtime's transformer optimizer (the Python fusions plus, at
    the model type's default level, ORT's offline optimization), then a session with exactly
    dayzero's settings."""
    name = "torch.onnx.export+ORT optimizer"
    try:
        import onnxscript  # noqa: F401
    except ImportError:
        return Peer(name, note="unavailable: pip install onnxscript")
    try:
        from onnxruntime.transformers import optimizer
    except ImportError as e:  # it ships in the onnxruntime wheel, but imports extra packages
        missing = getattr(e, "name", None) or str(e)
        return Peer(name, note=f"unavailable: onnxruntime.transformers.optimizer needs "
                               f"{missing} (pip install {missing})")
    types, heads, hidden = args
    model_type = next((t for t in types if t in optimizer.MODEL_TYPES), None)
    if model_type is None:
        return Peer(name, note=f"unavailable: this onnxruntime's optimizer has none of the "
                               f"model types {list(types)}")
    path = workdir / "exported_for_optimizer.onnx"
    start = time.perf_counter()
    _export(model, inputs, dynamic, path)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        optimized = optimizer.optimize_model(str(path), model_type=model_type, num_heads=heads,
                                             hidden_size=hidden)
    fused = {op: n for op, n in optimized.get_fused_operator_statistics().items() if n}
    return _ort_peer(name, optimized.model.SerializeToString(), inputs, workdir, session, start,
                     model_type=model_type, fused=fused,
                     contrib=sorted({f"{n.domain}.{n.op_type}" for n in optimized.model.graph.node
                                     if n.domain not in ("", "ai.onnx")}))


def dayzero_peer(model, inputs, dynamic, workdir: Path, session: dict,
                 exclude_kernels: tuple[str, ...] = ()) -> Peer:
    from backends.onnxruntime import read_record
    from backends.onnxruntime.fused import ContribFallbackWarning

    name = "dayzero" + (", no native kernels" if exclude_kernels else "")
    options = {"onnxruntime": {"exclude_kernels": list(exclude_kernels)}} if exclude_kernels \
        else None
    out = workdir / ("model-no-native.dz" if exclude_kernels else "model.dz")
    start = time.perf_counter()
    with warnings.catch_warnings():
        # the fallback that exclude_kernels asks for is the point of that row, not news
        warnings.simplefilter("ignore", ContribFallbackWarning)
        path = compiler.compile(model, inputs, out=out, backend="onnxruntime",
                                dynamic_shapes=dynamic, force=True, backend_options=options)
    loaded = runtime.load(path, session=session)
    took = time.perf_counter() - start
    arrays = [x.numpy() for x in inputs]
    graph = parse_ir((path / "graph.dzir").read_text())
    record = read_record(loaded.artifact)
    contrib = sorted({op for entry in record["nodes"] for op in entry["onnx"] if "." in op})
    shapes = [a.shape for a in arrays]
    run = lambda: loaded(*arrays)
    return Peer(name, took, run, _first(run()), dayzero=True,
                extra={"flops": matmul_flops(graph, shapes),
                       "flops_full": matmul_flops(graph, shapes, causal_half=False),
                       "contrib": contrib, "pipeline": loaded.manifest.get("pipeline")})


def no_native_peer(model, inputs, dynamic, workdir: Path, session: dict, dz: Peer) -> Peer:
    """dayzero with its native kernels excluded; the same artifact as dz's (so not run again)
    when dz uses none."""
    if NATIVE_KERNEL not in dz.extra.get("contrib", ()):
        return Peer("dayzero, no native kernels", dayzero=True,
                    note=f"same artifact as dayzero's: {NATIVE_KERNEL} not used here")
    return dayzero_peer(model, inputs, dynamic, workdir, session, (NATIVE_KERNEL,))


# every peer's compile, by name, as the cold subprocess runs it (same functions as in process)
PEER_BUILDERS: dict[str, Callable] = {
    "eager": lambda w, m, i, d, tmp, s: eager_peer(m, i),
    "torch.compile": lambda w, m, i, d, tmp, s: compile_peer(m, i),
    "torch.onnx.export+ORT": lambda w, m, i, d, tmp, s: onnx_export_peer(m, i, d, tmp, s),
    "torch.onnx.export+ORT optimizer":
        lambda w, m, i, d, tmp, s: optimizer_peer(m, i, d, tmp, s, OPTIMIZER_ARGS[w]),
    "dayzero": lambda w, m, i, d, tmp, s: dayzero_peer(m, i, d, tmp, s),
    "torch.compile(backend=dayzero)": lambda w, m, i, d, tmp, s: dynamo_peer(m, i),
    "dayzero, no native kernels":
        lambda w, m, i, d, tmp, s: dayzero_peer(m, i, d, tmp, s, (NATIVE_KERNEL,)),
}


def cold_compile(workload: str, peer: str, session: dict, command: list[str] | None = None,
                 timeout_s: float = 900) -> tuple[float | None, str]:
    """`peer`'s compile time for `workload` in a fresh Python process: nothing of dynamo,
    torch.export or Inductor has run in it, and Inductor gets an empty cache folder. The model
    is built before the clock starts. Returns (seconds, "") or (None, why not)."""
    command = command or [sys.executable, str(Path(__file__).resolve()), "--cold-compile",
                          workload, peer, "--session", json.dumps(session)]
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        try:
            done = subprocess.run(command, capture_output=True, text=True, env=env,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None, f"cold compile timed out after {timeout_s:.0f} s"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"cold compile failed: {tail}"
    result = json.loads(lines[-1])
    return result.get("compile_s"), result.get("note", "")


def _cold_compile_child(workload: str, peer: str, session: dict) -> int:
    model, inputs, dynamic = WORKLOADS[workload]()
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        p = PEER_BUILDERS[peer](workload, model, inputs, dynamic, Path(tmp), session)
    print(json.dumps({"compile_s": p.compile_s, "note": p.note}))
    return 0


def time_interleaved(peers: list[Peer], repeat: int, block: int = 5, warmup: int = 2,
                     pause_s: float = 0.2) -> None:
    """Interleave the peers in blocks, so that a busy moment on the machine hits them all alike.

    Each round runs every peer once, in a shuffled (seeded) order, as a block: a pause, `warmup`
    untimed calls, then `block` timed calls back to back, as a serving loop makes them. The pause
    lets the previous peer's worker threads go idle (torch's OpenMP workers and ORT's spinning
    workers keep a core busy for a while after a call); without it, whichever peer runs next is
    measured against them.
    """
    ready = [p for p in peers if p.run is not None]
    order = random.Random(0)
    with torch.no_grad():
        for _ in range(-(-repeat // block)):
            order.shuffle(ready)
            for p in ready:
                time.sleep(pause_s)
                for _ in range(warmup):
                    p.run()
                # CPU over the whole block: a worker's spinning between two calls is charged to
                # the process late (at the scheduler's tick), so per-call readings can exceed
                # the cores' worth of the call's wall time; per block they add up
                cpu = time.process_time()
                for _ in range(block):
                    start = time.perf_counter()
                    p.run()
                    p.times.append(time.perf_counter() - start)
                p.cpu_times.append((time.process_time() - cpu) / block)
                p.rounds.append(statistics.median(p.times[-block:]))


def paired_ratio(a: Peer, b: Peer) -> tuple[float, float, float] | None:
    """a's time over b's, round by round (each pair measured seconds apart, so a drift in the
    machine's speed cancels): the median and the quartiles over the rounds."""
    ratios = [x / y for x, y in zip(a.rounds, b.rounds)]
    if len(ratios) < 2:
        return None
    q1, q2, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return q2, q1, q3


def _diff(out, ref) -> float:
    return float(np.max(np.abs(np.asarray(out, dtype=np.float64) - ref)))


# -- roofline -----------------------------------------------------------------------------------

def causal_pairs(queries: int, keys: int) -> int:
    """(query, key) pairs causal attention needs: query i sees keys 0..i (torch's is_causal,
    aligned at the top left), so S(S+1)/2 for a square S x S matrix."""
    full = min(queries, keys)
    return full * (full + 1) // 2 + max(queries - keys, 0) * keys


def matmul_flops(graph, shapes, causal_half: bool = True) -> int:
    """FLOPs of the graph's matmul-class ops (linear, matmul, conv, attention) at these shapes,
    fused ops counted through their decompositions. Causal attention counts the query-key pairs
    it needs (`causal_pairs`: S(S+1)/2 for S x S), unless causal_half=False, which counts the
    full matrix as kernels that mask after the product compute it."""
    import sympy

    from passes import PassManager

    graph = PassManager("decompose_fused{ops=fused}").run(graph)

    bindings = {}
    for value, shape in zip(graph.inputs, shapes):
        for dim, size in zip(value.type.shape, shape):
            if isinstance(dim, sympy.Symbol):
                bindings[dim.name] = int(size)
    size = lambda d: evaluate(d, bindings)
    numel = lambda shape: int(np.prod([size(d) for d in shape], dtype=np.int64))
    total = 0
    for node in graph.nodes:
        ins = [v.type.shape if v is not None else None for v in node.inputs]
        out = node.outputs[0].type.shape
        if node.op in ("linear", "matmul"):
            total += 2 * numel(out) * size(ins[0][-1])
        elif node.op == "conv":
            w = ins[1]
            total += 2 * numel(out) * numel(w[1:])
        elif node.op == "scaled_dot_product_attention":
            q, k, v = ins[0], ins[1], ins[2]
            lq, lk = size(q[-2]), size(k[-2])
            pairs = (causal_pairs(lq, lk) if node.attrs.get("is_causal") and causal_half
                     else lq * lk)
            # q k^T and probs v, per pair: 2 * head size each
            total += 2 * numel(q[:-2]) * pairs * (size(q[-1]) + size(v[-1]))
    return total


def roofline_ms(flops: int, rate: float) -> float:
    """The floor: the matmul FLOPs at the machine's best measured GEMM rate (FLOP/s), in ms."""
    return flops / rate * 1e3


def gemm_rate(threads: int) -> tuple[float, str]:
    """Best fp32 GEMM rate (FLOP/s) measured here, and which library reached it.

    Square products around the models' sizes, through torch.mm and through an ONNX Runtime
    MatMul (MLAS), with the same thread count the peers get; the floor uses the faster.
    """
    from onnx import TensorProto, helper, numpy_helper

    torch.set_num_threads(threads)
    best = (0.0, "")
    for n in (256, 512, 1024):
        a, b = torch.randn(n, n), torch.randn(n, n)
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "gemm", [x],
                                  [y], [numpy_helper.from_array(b.numpy(), "w")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        session = create_session(model.SerializeToString(), SessionConfig())
        feeds = {"x": a.numpy()}
        for name, fn in (("torch", lambda a=a, b=b: torch.mm(a, b)),
                         ("onnxruntime", lambda s=session, f=feeds: s.run(None, f))):
            for _ in range(3):
                fn()
            seconds = min(_timed(fn) for _ in range(20))
            best = max(best, (2 * n**3 / seconds, name))
    return best


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# -- report -------------------------------------------------------------------------------------

def bench(name: str, repeat: int, session: dict, cold: bool = True) -> list[Peer]:
    model, inputs, dynamic = WORKLOADS[name]()
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        workdir = Path(tmp)
        peers = [eager_peer(model, inputs), compile_peer(model, inputs),
                 onnx_export_peer(model, inputs, dynamic, workdir, session),
                 optimizer_peer(model, inputs, dynamic, workdir, session, OPTIMIZER_ARGS[name]),
                 dayzero_peer(model, inputs, dynamic, workdir, session)]
        peers.append(no_native_peer(model, inputs, dynamic, workdir, session, peers[-1]))
        peers.append(dynamo_peer(model, inputs))
        time_interleaved(peers, repeat)
    if cold:
        for p in peers:
            if p.run is not None and p.name != "eager":
                p.cold_compile_s, why = cold_compile(name, p.name, session)
                p.note = p.note or why
    return peers


def best_peer(peers: list[Peer]) -> Peer | None:
    """The fastest peer by median that is not one of dayzero's rows: what dayzero is judged by."""
    timed = [p for p in peers if p.latency_ms is not None and not p.dayzero]
    return min(timed, key=lambda p: p.latency_ms) if timed else None


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def report(name: str, peers: list[Peer], rate: float) -> str:
    by_name = {p.name: p for p in peers}
    eager, dz = by_name["eager"], by_name["dayzero"]
    best = best_peer(peers)
    ref = eager.output
    lines = [f"### {name}", "",
             "| peer | compile cold (s) | compile in process (s) | median (ms) | best (ms) "
             "| CPU per call (ms) | vs eager | vs best peer | max abs diff vs eager | note |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for p in peers:
        if p.latency_ms is None:
            lines.append(f"| {p.name} | - | - | - | - | - | - | - | - | {p.note} |")
            continue
        vs_best = f"{p.latency_ms / best.latency_ms:.2f}x" if best else "-"
        note = p.note
        if p.extra.get("fused"):
            note = (f"{note}; " if note else "") + f"model_type {p.extra['model_type']}, " + \
                ", ".join(f"{op} x{n}" for op, n in sorted(p.extra["fused"].items()))
        elif "model_type" in p.extra:
            note = (f"{note}; " if note else "") + \
                f"model_type {p.extra['model_type']}: nothing fused"
        lines.append(f"| {p.name} | {_s(p.cold_compile_s)} | {_s(p.compile_s)} | "
                     f"{p.latency_ms:.2f} | {p.best_ms:.2f} | {p.cpu_ms:.2f} | "
                     f"{p.latency_ms / eager.latency_ms:.2f}x | {vs_best} | "
                     f"{_diff(p.output, ref):.1e} | {note} |")
    flops, full = dz.extra["flops"], dz.extra["flops_full"]
    floor_ms = roofline_ms(flops, rate)
    lines += ["", f"- best peer (fastest median that is not dayzero): "
                  f"{best.name if best else 'none'}"]
    lines.append(f"- roofline floor: {flops / 1e9:.3f} GFLOP of matmuls (causal attention counted "
                 f"as the S(S+1)/2 query-key pairs it needs; {full / 1e9:.3f} GFLOP with the full "
                 f"S x S) at {rate / 1e9:.0f} GFLOP/s = {floor_ms:.2f} ms (dayzero's median is "
                 f"{dz.latency_ms / floor_ms:.1f}x the floor)")
    kernels = sorted({k for p in peers for k in p.extra.get("contrib", ())
                      if k in ATTENTION_KERNELS})
    for k in kernels:
        users = [p.name for p in peers if k in p.extra.get("contrib", ())]
        lines.append(f"- {k} ({', '.join(users)}): {ATTENTION_KERNELS[k]}")
    if best:
        paired = paired_ratio(dz, best)
        if paired:
            lines.append(f"- dayzero over {best.name}, round by round: median "
                         f"{paired[0]:.2f}x (quartiles {paired[1]:.2f}x-{paired[2]:.2f}x "
                         f"over {len(dz.rounds)} rounds)")
    no_native = by_name.get("dayzero, no native kernels")
    if no_native and no_native.latency_ms:
        paired = paired_ratio(dz, no_native)
        share = f"; round by round {paired[0]:.2f}x" if paired else ""
        lines.append(f"- dayzero's native kernels: dayzero {dz.latency_ms:.2f} ms against "
                     f"{no_native.latency_ms:.2f} ms without them "
                     f"({dz.latency_ms / no_native.latency_ms:.2f}x{share})")
    lines.append("- compile: cold is a fresh subprocess per peer (model built before the clock, "
                 "empty Inductor cache), model to loaded executable; in process is order-"
                 "dependent (dayzero compiles after dynamo and torch.export already ran)")
    lines.append(f"- dayzero pipeline: {dz.extra['pipeline']}; fused and native kernels: "
                 f"{', '.join(dz.extra['contrib']) or 'none'}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated subset of {', '.join(WORKLOADS)}")
    parser.add_argument("--repeat", type=int, default=30, help="timed runs per peer")
    parser.add_argument("--spinning", choices=("auto", "on", "off"), default="auto",
                        help="ORT thread spinning for every ORT peer (auto: decided once, from "
                             "the load average at the start, as dayzero's loader decides it)")
    parser.add_argument("--no-cold", action="store_true",
                        help="skip the cold compiles (one fresh subprocess per peer)")
    parser.add_argument("--cold-compile", nargs=2, metavar=("WORKLOAD", "PEER"),
                        help=argparse.SUPPRESS)  # the subprocess's entry point
    parser.add_argument("--session", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cold_compile:
        session = json.loads(args.session)
        torch.set_num_threads(session["intra_op_threads"])
        return _cold_compile_child(*args.cold_compile, session)
    names = [n for n in args.workloads.split(",") if n]
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown workloads {unknown}; choose from {sorted(WORKLOADS)}")
    spinning = {"auto": "auto", "on": True, "off": False}[args.spinning]
    decided = SessionConfig(allow_spinning=spinning).resolve()
    # every ORT peer gets exactly these settings, decided once
    session = {"intra_op_threads": decided.intra_op_threads,
               "allow_spinning": decided.allow_spinning}
    threads = decided.intra_op_threads
    torch.set_num_threads(threads)
    rate, library = gemm_rate(threads)
    print(f"# peers: {threads} threads, torch {torch.__version__}, onnxruntime "
          f"{_version('onnxruntime')}, fp32 GEMM {rate / 1e9:.0f} GFLOP/s ({library}), "
          f"load average {os.getloadavg()[0]:.1f}, ORT session for every ORT peer "
          f"{SessionConfig(**session).to_dict()} (spinning {args.spinning})\n")
    for name in names:
        print(report(name, bench(name, args.repeat, session, cold=not args.no_cold), rate),
              flush=True)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 0


def _version(package: str) -> str:
    import importlib.metadata

    return importlib.metadata.version(package)


if __name__ == "__main__":
    sys.exit(main())
