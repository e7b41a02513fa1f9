"""dayzero's onnxruntime artifact against the tools a user would pick instead, side by side.

For each workload, in one process and on the same inputs: PyTorch eager, torch.compile
(Inductor), torch.onnx.export + ONNX Runtime (with exactly dayzero's session options), and
dayzero's artifact via runtime.load. Prints compile time (model to loaded executable), median
latency, ratios, the largest difference from eager, and the roofline floor: the model's matmul
FLOPs divided by this machine's measured fp32 GEMM rate.

    python benchmarks/peers.py                       # every workload
    python benchmarks/peers.py --workloads decoder-128 --repeat 50

torch.onnx.export needs the `onnxscript` package (pip install onnxscript); without it that peer
is reported as unavailable. This is a script, not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import random
import statistics
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


def onnx_export_peer(model, inputs, dynamic, workdir: Path, session: dict) -> Peer:
    try:
        import onnxscript  # noqa: F401
    except ImportError:
        return Peer("torch.onnx.export+ORT", note="unavailable: pip install onnxscript")
    path = workdir / "exported.onnx"
    start = time.perf_counter()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model, inputs, str(path), dynamo=True, dynamic_shapes=dynamic,
                          verbose=False)
    session = create_session(path.read_bytes(), SessionConfig(**session), workdir)
    took = time.perf_counter() - start
    feeds = {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs)}
    run = lambda: session.run(None, feeds)
    return Peer("torch.onnx.export+ORT", took, run, _first(run()))


def dayzero_peer(model, inputs, dynamic, workdir: Path, session: dict) -> Peer:
    from backends.onnxruntime import read_record

    start = time.perf_counter()
    path = compiler.compile(model, inputs, out=workdir / "model.dz", backend="onnxruntime",
                            dynamic_shapes=dynamic, force=True)
    loaded = runtime.load(path, session=session)
    took = time.perf_counter() - start
    arrays = [x.numpy() for x in inputs]
    graph = parse_ir((path / "graph.dzir").read_text())
    record = read_record(loaded.artifact)
    contrib = sorted({op for entry in record["nodes"] for op in entry["onnx"] if "." in op})
    run = lambda: loaded(*arrays)
    return Peer("dayzero", took, run, _first(run()),
                extra={"flops": matmul_flops(graph, [a.shape for a in arrays]),
                       "contrib": contrib, "pipeline": loaded.manifest.get("pipeline")})


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

def matmul_flops(graph, shapes) -> int:
    """FLOPs of the graph's matmul-class ops (linear, matmul, conv, attention) at these shapes,
    fused ops counted through their decompositions."""
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
        if node.op == "linear":
            total += 2 * numel(out) * size(ins[0][-1])
        elif node.op == "matmul":
            total += 2 * numel(out) * size(ins[0][-1])
        elif node.op == "conv":
            w = ins[1]
            total += 2 * numel(out) * numel(w[1:])
        elif node.op == "scaled_dot_product_attention":
            q, k = ins[0], ins[1]
            total += 2 * 2 * numel(q[:-1]) * size(k[-2]) * size(q[-1])
    return total


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

def bench(name: str, repeat: int, session: dict) -> list[Peer]:
    model, inputs, dynamic = WORKLOADS[name]()
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        workdir = Path(tmp)
        peers = [eager_peer(model, inputs), compile_peer(model, inputs),
                 onnx_export_peer(model, inputs, dynamic, workdir, session),
                 dayzero_peer(model, inputs, dynamic, workdir, session)]
        time_interleaved(peers, repeat)
    return peers


def report(name: str, peers: list[Peer], rate: float) -> str:
    eager, _, ort_export, dz = peers
    ref = eager.output
    lines = [f"### {name}", "",
             "| peer | compile (s) | median (ms) | best (ms) | CPU per call (ms) | vs eager "
             "| vs onnx.export+ORT | max abs diff vs eager |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for p in peers:
        if p.latency_ms is None:
            lines.append(f"| {p.name} | - | - | - | - | - | - | {p.note} |")
            continue
        vs_ort = f"{p.latency_ms / ort_export.latency_ms:.2f}x" if ort_export.latency_ms else "-"
        lines.append(f"| {p.name} | {p.compile_s:.2f} | {p.latency_ms:.2f} | {p.best_ms:.2f} | "
                     f"{p.cpu_ms:.2f} | "
                     f"{p.latency_ms / eager.latency_ms:.2f}x | {vs_ort} | "
                     f"{_diff(p.output, ref):.1e} |")
    floor_ms = dz.extra["flops"] / rate * 1e3
    lines += ["", f"- roofline floor: {dz.extra['flops'] / 1e9:.3f} GFLOP of matmuls at "
              f"{rate / 1e9:.0f} GFLOP/s = {floor_ms:.2f} ms (dayzero's median is "
              f"{dz.latency_ms / floor_ms:.1f}x the floor)"]
    paired = paired_ratio(dz, ort_export)
    if paired:
        lines.append(f"- dayzero over torch.onnx.export+ORT, round by round: median "
                     f"{paired[0]:.2f}x (quartiles {paired[1]:.2f}x-{paired[2]:.2f}x "
                     f"over {len(dz.rounds)} rounds)")
    if ort_export.compile_s:
        lines.append(f"- compile time (model to loaded executable): dayzero {dz.compile_s:.2f} s, "
                     f"torch.onnx.export + session {ort_export.compile_s:.2f} s "
                     f"({dz.compile_s / ort_export.compile_s:.2f}x)")
    lines.append(f"- dayzero pipeline: {dz.extra['pipeline']}; fused and native kernels: "
                 f"{', '.join(dz.extra['contrib']) or 'none'}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated subset of {', '.join(WORKLOADS)}")
    parser.add_argument("--repeat", type=int, default=30, help="timed runs per peer")
    parser.add_argument("--spinning", choices=("auto", "on", "off"), default="auto",
                        help="ORT thread spinning for both ORT peers (auto: decided once, from "
                             "the load average at the start, as dayzero's loader decides it)")
    args = parser.parse_args(argv)
    names = [n for n in args.workloads.split(",") if n]
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown workloads {unknown}; choose from {sorted(WORKLOADS)}")
    spinning = {"auto": "auto", "on": True, "off": False}[args.spinning]
    decided = SessionConfig(allow_spinning=spinning).resolve()
    # both ORT peers get exactly these settings, decided once
    session = {"intra_op_threads": decided.intra_op_threads,
               "allow_spinning": decided.allow_spinning}
    threads = decided.intra_op_threads
    torch.set_num_threads(threads)
    rate, library = gemm_rate(threads)
    print(f"# peers: {threads} threads, torch {torch.__version__}, onnxruntime "
          f"{_version('onnxruntime')}, fp32 GEMM {rate / 1e9:.0f} GFLOP/s ({library}), "
          f"load average {os.getloadavg()[0]:.1f}, ORT session for both ORT peers "
          f"{SessionConfig(**session).to_dict()} (spinning {args.spinning})\n")
    for name in names:
        print(report(name, bench(name, args.repeat, session), rate), flush=True)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 0


def _version(package: str) -> str:
    import importlib.metadata

    return importlib.metadata.version(package)


if __name__ == "__main__":
    sys.exit(main())
