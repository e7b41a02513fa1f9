"""paged_attention on ONNX Runtime: dayzero's native PagedAttention kernel against torch's
scaled_dot_product_attention on the same shapes (contiguous keys), at long context.

The 150M Llama-shaped benchmark's attention (16 query heads, 4 KV heads, head size 64, rotary):
one graph holding one paged_attention node is compiled with the onnxruntime backend and run on
generation steps whose cached keys live in shuffled 16-slot pool blocks (as the runtime's paged
cache places them): a prefill chunk of `--chunk` tokens after `--cached` keys, and a decode step
of one token per sequence, for each count in `--sequences`, after each of `--decode` keys.
torch sees the same rotated queries, keys and values
as contiguous [1, heads, L, 64] tensors (GQA through `enable_gqa`, a prefill chunk's causal
offset through a boolean mask, as transformers passes it). Both use `--threads` threads and
alternate in rounds, so the machine's drift hits both alike. Prints the median ms per call of
each, their ratio and, for a decode step, its bytes-read floor: the time torch takes to sum a
tensor of as many bytes as the step's keys and values (what it must read), with the same
threads, timed in the same rounds. Checks that both agree.

    python benchmarks/paged_attention.py                        # 512 after 8192; decode 8k, 32k
    python benchmarks/paged_attention.py --chunk 128 --cached 1024 --decode 4096 --rounds 3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.onnxruntime import OnnxRuntimeBackend  # noqa: E402
from compiler.ir import DType, Graph, TensorType  # noqa: E402
from compiler.writer import write_artifact  # noqa: E402
from runtime.artifact import Artifact  # noqa: E402

HEADS, KV_HEADS, SIZE, BLOCK = 16, 4, 64, 16
NAMES = ["q", "k", "v", "cos", "sin", "k_cache", "v_cache", "seq_slots", "token_seq",
         "token_len"]


def step(tokens: int, cached: int, seed: int = 0, sequences: int = 1) -> dict[str, np.ndarray]:
    """`sequences` sequences, each `tokens` new tokens after `cached` keys held in shuffled pool
    blocks (the sequences' tokens packed one sequence after another, as the runtime packs a
    step)."""
    rng = np.random.default_rng(seed)
    per_sequence = -(-cached // BLOCK) + 1
    order = rng.permutation(per_sequence * sequences).reshape(sequences, per_sequence)
    slots = np.empty((sequences, cached + tokens), np.int64)
    for s, blocks in enumerate(order):
        slots[s, :cached] = (blocks[:, None] * BLOCK + np.arange(BLOCK)).reshape(-1)[:cached]
        slots[s, cached:] = -2 - (s * tokens + np.arange(tokens))
    positions = np.tile(cached + np.arange(tokens), sequences)
    angles = positions[:, None] / 10000.0 ** (np.arange(SIZE) % (SIZE // 2) / (SIZE // 2))
    total, pool = sequences * tokens, per_sequence * sequences * BLOCK
    arrays = dict(
        q=rng.standard_normal((1, total, HEADS * SIZE)),
        k=rng.standard_normal((1, total, KV_HEADS * SIZE)),
        v=rng.standard_normal((1, total, KV_HEADS * SIZE)),
        cos=np.cos(angles), sin=np.sin(angles),
        k_cache=rng.standard_normal((pool, KV_HEADS, SIZE)),
        v_cache=rng.standard_normal((pool, KV_HEADS, SIZE)))
    arrays = {k: a.astype(np.float32) for k, a in arrays.items()}
    arrays.update(seq_slots=slots, token_seq=np.repeat(np.arange(sequences), tokens),
                  token_len=(positions + 1).astype(np.int64))
    return arrays


def graph(arrays: dict[str, np.ndarray]) -> Graph:
    g = Graph("paged")
    values = [g.add_input(n, TensorType(DType.i64 if arrays[n].dtype == np.int64 else DType.f32,
                                        arrays[n].shape)) for n in NAMES]
    g.outputs = list(g.add_node("paged_attention", values,
                                dict(num_heads=HEADS, kv_num_heads=KV_HEADS)).outputs)
    return g


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [T, heads, size] * cos + rotate_half(x) * sin, the tables [T, size]."""
    half = np.concatenate([-x[..., SIZE // 2:], x[..., :SIZE // 2]], axis=-1)
    return x * cos[:, None] + half * sin[:, None]


def torch_inputs(arrays: dict[str, np.ndarray], new_k: np.ndarray) -> dict[str, torch.Tensor]:
    """The step as contiguous tensors for scaled_dot_product_attention, a batch row per
    sequence."""
    slots = arrays["seq_slots"]
    sequences, tokens = slots.shape[0], arrays["q"].shape[1] // slots.shape[0]
    q = rotate(arrays["q"][0].reshape(-1, HEADS, SIZE), arrays["cos"], arrays["sin"])
    new_v = arrays["v"][0].reshape(-1, KV_HEADS, SIZE)
    rows = {"query": [], "key": [], "value": []}
    for s in range(sequences):
        mine = slice(s * tokens, (s + 1) * tokens)
        cached = slots[s, :-tokens]
        rows["query"].append(q[mine])
        rows["key"].append(np.concatenate([arrays["k_cache"][cached], new_k[mine]]))
        rows["value"].append(np.concatenate([arrays["v_cache"][cached], new_v[mine]]))
    x = {name: torch.from_numpy(np.ascontiguousarray(np.stack(r).transpose(0, 2, 1, 3)))
         for name, r in rows.items()}
    length = x["key"].shape[2]
    mask = None
    if tokens > 1:  # bottom-right causal: token t sees keys [0, length - tokens + t]
        mask = torch.from_numpy(np.arange(length)[None] <= (arrays["token_len"][:tokens, None]
                                                            - 1))
    return dict(query=x["query"], key=x["key"], value=x["value"], attn_mask=mask)


def sdpa(x: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return torch.nn.functional.scaled_dot_product_attention(**x, enable_gqa=True)


def median_ms(call, calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def compare(name: str, tokens: int, cached: int, threads: int, rounds: int,
            calls: int, sequences: int = 1) -> dict[str, float]:
    """Times one step on both; returns and prints the medians (ms)."""
    arrays = step(tokens, cached, sequences=sequences)
    backend = OnnxRuntimeBackend()
    with tempfile.TemporaryDirectory() as tmp:
        path = write_artifact(Path(tmp) / "paged.dz", graph(arrays), backend)
        run = backend.load(Artifact(path), session={"intra_op_threads": threads})
        x = [arrays[n] for n in NAMES]
        out, new_k, _ = run(x)
        want = sdpa(torch_inputs(arrays, new_k)).numpy()
        got = out[0].reshape(sequences, tokens, HEADS, SIZE).transpose(0, 2, 1, 3)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        t_in = torch_inputs(arrays, new_k)
        kv_bytes = torch.ones(sequences * (cached + tokens) * KV_HEADS * SIZE * 2)
        contenders = {"native": lambda: run(x), "sdpa": lambda: sdpa(t_in),
                      "floor": lambda: kv_bytes.sum()}
        times = {name: [] for name in contenders}
        for _ in range(rounds):
            for key, call in contenders.items():
                times[key].append(median_ms(call, calls))
    native, torch_ms, floor = (float(np.median(times[n])) for n in ("native", "sdpa", "floor"))
    line = (f"{name:<28} native {native:9.3f} ms   torch sdpa {torch_ms:9.3f} ms   "
            f"native/sdpa {native / torch_ms:5.2f}")
    if tokens == 1:
        line += f"   floor {floor:7.3f} ms   native/floor {native / floor:5.2f}"
    print(line, flush=True)
    return {"native": native, "sdpa": torch_ms, "floor": floor}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunk", type=int, default=512, help="prefill chunk tokens (0: none)")
    parser.add_argument("--cached", type=int, default=8192, help="keys before the chunk")
    parser.add_argument("--decode", default="8192,32768", help="cached keys of decode steps")
    parser.add_argument("--sequences", default="1,8",
                        help="sequences per decode step (each after the same cached keys)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"paged_attention: {HEADS} heads, {KV_HEADS} kv heads, head {SIZE}, rotary, "
          f"{args.threads} threads")
    if args.chunk:
        compare(f"prefill {args.chunk} after {args.cached}", args.chunk, args.cached,
                args.threads, args.rounds, args.calls)
    for sequences in (int(n) for n in args.sequences.split(",") if n):
        for cached in (int(c) for c in args.decode.split(",") if c):
            compare(f"decode x{sequences} after {cached}", 1, cached, args.threads,
                    args.rounds, args.calls * 10, sequences)
    return 0


if __name__ == "__main__":
    sys.exit(main())
