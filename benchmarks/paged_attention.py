"""paged_attention on ONNX Runtime: dayzero's native PagedAttention kernel against the op's
decomposition (the lowering where the kernel is excluded), on a decode step.

One graph holding one paged_attention node (16 query heads, 4 KV heads, head size 64, rotary)
is compiled twice with the onnxruntime backend, once with `exclude_kernels` naming the native
kernel; both artifacts run the same step, `--tokens` decoding tokens of as many sequences with
`--cached` keys each in scattered pool slots, alternating in rounds so that the machine's drift
hits both alike. Prints the median per call of each and their ratio, and checks they agree.

    python benchmarks/paged_attention.py                  # 1 token, 1024 cached keys
    python benchmarks/paged_attention.py --tokens 8 --cached 4096 --rounds 20
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.onnxruntime import OnnxRuntimeBackend  # noqa: E402
from compiler.ir import DType, Graph, TensorType  # noqa: E402
from compiler.writer import write_artifact  # noqa: E402
from runtime.artifact import Artifact  # noqa: E402

HEADS, KV_HEADS, SIZE = 16, 4, 64
NATIVE = "ai.dayzero.PagedAttention"


def step(tokens: int, cached: int, seed: int = 0) -> dict[str, np.ndarray]:
    """`tokens` sequences decoding one token each after `cached` keys in a shuffled pool."""
    rng = np.random.default_rng(seed)
    pool = tokens * cached + 16
    order = rng.permutation(pool)
    slots = np.empty((tokens, cached + 1), np.int64)
    slots[:, :cached] = order[:tokens * cached].reshape(tokens, cached)
    slots[:, cached] = -2 - np.arange(tokens)
    angles = np.full((tokens, 1), cached) / 10000.0 ** (np.arange(SIZE) % (SIZE // 2) / SIZE)
    arrays = dict(
        q=rng.standard_normal((1, tokens, HEADS * SIZE)),
        k=rng.standard_normal((1, tokens, KV_HEADS * SIZE)),
        v=rng.standard_normal((1, tokens, KV_HEADS * SIZE)),
        cos=np.cos(angles), sin=np.sin(angles),
        k_cache=rng.standard_normal((pool, KV_HEADS, SIZE)),
        v_cache=rng.standard_normal((pool, KV_HEADS, SIZE)))
    arrays = {k: a.astype(np.float32) for k, a in arrays.items()}
    arrays.update(seq_slots=slots, token_seq=np.arange(tokens, dtype=np.int64),
                  token_len=np.full(tokens, cached + 1, np.int64))
    return arrays


def graph(arrays: dict[str, np.ndarray]) -> Graph:
    g = Graph("paged")
    names = ["q", "k", "v", "cos", "sin", "k_cache", "v_cache", "seq_slots", "token_seq",
             "token_len"]
    values = [g.add_input(n, TensorType(DType.i64 if arrays[n].dtype == np.int64 else DType.f32,
                                        arrays[n].shape)) for n in names]
    g.outputs = list(g.add_node("paged_attention", values,
                                dict(num_heads=HEADS, kv_num_heads=KV_HEADS)).outputs)
    return g


def median_ms(run, x, calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        run(x)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=1)
    parser.add_argument("--cached", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    arrays = step(args.tokens, args.cached)
    g = graph(arrays)
    x = list(arrays.values())
    backend = OnnxRuntimeBackend()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for name, options in (("native", {}), ("decomposition", {"exclude_kernels": [NATIVE]})):
            path = write_artifact(Path(tmp) / f"{name}.dz", g, backend, options=options)
            runs[name] = backend.load(Artifact(path))
        outs = {name: run(x) for name, run in runs.items()}
        for a, b in zip(outs["native"], outs["decomposition"]):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
        medians = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, run in runs.items():
                medians[name].append(median_ms(run, x, args.calls))
    native, decomposed = (float(np.median(medians[n])) for n in ("native", "decomposition"))
    print(f"paged_attention decode: {args.tokens} token(s) x {args.cached} cached keys, "
          f"{HEADS} heads, {KV_HEADS} kv heads, head {SIZE}")
    print(f"  native PagedAttention  {native:8.3f} ms")
    print(f"  decomposition          {decomposed:8.3f} ms   ({decomposed / native:.1f}x)")


if __name__ == "__main__":
    main()
