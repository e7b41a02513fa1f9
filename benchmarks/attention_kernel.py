"""dayzero's native causal attention kernel against ONNX Runtime's GroupQueryAttention.

Both run as one-node ONNX models in ONNX Runtime sessions with the same settings, on the same
packed QKV projection and rotary caches (the benchmark decoder's layer: 8 query heads, 4 KV
heads, head size 32), alternating in rounds so that the machine's drift hits both alike. Each
block of timed calls follows a pause (a session's spinning workers would otherwise take the
cores from the next one) and 20 ms of untimed calls (until both cores are busy again). Prints
the median per call of each and their ratio, per sequence length and thread count, and checks
that the two agree.

    python benchmarks/attention_kernel.py      # seq 128, 512, 2048; 1 and 2 threads
    python benchmarks/attention_kernel.py --seq 128 --threads 2 --rounds 40
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.onnxruntime import native_ops  # noqa: E402
from backends.onnxruntime.ort_module import ort  # noqa: E402 - telemetry off (issue 33)
from backends.onnxruntime.session import SessionConfig, session_options  # noqa: E402

HEADS, KV_HEADS, SIZE = 8, 4, 32
PAUSE_S = 0.2
# Calls before each timed block: on a VM an idle vCPU is descheduled, and a 100 us op measured
# right after a pause runs on one core while the pool's other worker wakes up (measured: 160 us
# for the first calls after a pause, 100 us once both cores are busy, as they are inside a model).
WARM_S = 0.02
F, I32 = TensorProto.FLOAT, TensorProto.INT32


def models(seq: int):
    """(GroupQueryAttention model, CausalAttention model) over the same inputs."""
    width = (HEADS + 2 * KV_HEADS) * SIZE
    attrs = dict(num_heads=HEADS, kv_num_heads=KV_HEADS, scale=SIZE ** -0.5,
                 rotary_interleaved=0)
    common = [helper.make_tensor_value_info("qkv", F, [1, seq, width]),
              helper.make_tensor_value_info("cos", F, [None, SIZE // 2]),
              helper.make_tensor_value_info("sin", F, [None, SIZE // 2])]
    out = [helper.make_tensor_value_info("out", F, None)]
    gqa = helper.make_node("GroupQueryAttention",
                           ["qkv", "", "", "", "", "seqlens", "total", "cos", "sin"],
                           ["out", "present_k", "present_v"], domain="com.microsoft",
                           do_rotary=1, **attrs)
    lengths = [helper.make_tensor_value_info("seqlens", I32, [1]),
               helper.make_tensor_value_info("total", I32, [1])]
    native = helper.make_node("CausalAttention", ["qkv", "", "", "cos", "sin"], ["out"],
                              domain=native_ops.DOMAIN, **attrs)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1),
              helper.make_opsetid(native_ops.DOMAIN, 1)]
    return (helper.make_model(helper.make_graph([gqa], "gqa", common + lengths, out),
                              opset_imports=opsets),
            helper.make_model(helper.make_graph([native], "native", common, out),
                              opset_imports=opsets))


def feeds(seq: int) -> tuple[dict, dict]:
    rng = np.random.default_rng(seq)
    qkv = rng.standard_normal((1, seq, (HEADS + 2 * KV_HEADS) * SIZE), dtype=np.float32)
    angles = np.arange(seq)[:, None] / 10000.0 ** (np.arange(SIZE // 2) / (SIZE // 2))[None]
    native = {"qkv": qkv, "cos": np.cos(angles).astype(np.float32),
              "sin": np.sin(angles).astype(np.float32)}
    lengths = {"seqlens": np.array([seq - 1], np.int32), "total": np.array([seq], np.int32)}
    return {**native, **lengths}, native


def measure(seq: int, threads: int, rounds: int) -> tuple[float, float, float]:
    """Median seconds per call of GQA and of CausalAttention, and their largest difference."""
    options = session_options(SessionConfig(intra_op_threads=threads, allow_spinning=True))
    sessions = [ort.InferenceSession(m.SerializeToString(), options,
                                     providers=["CPUExecutionProvider"]) for m in models(seq)]
    inputs = feeds(seq)
    outputs = [s.run(["out"], f)[0] for s, f in zip(sessions, inputs)]
    times: list[list[float]] = [[], []]
    for _ in range(rounds):
        for i, (session, f) in enumerate(zip(sessions, inputs)):
            time.sleep(PAUSE_S)  # the other session's spinning workers go idle
            warm_until = time.perf_counter() + WARM_S
            while time.perf_counter() < warm_until:
                session.run(["out"], f)
            for _ in range(5):
                start = time.perf_counter()
                session.run(["out"], f)
                times[i].append(time.perf_counter() - start)
    gqa, native = (float(np.median(t)) for t in times)
    return gqa, native, float(np.abs(outputs[0] - outputs[1]).max())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, nargs="+", default=[128, 512, 2048])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    if native_ops.library() is None:
        print("dayzero's native kernels are not built (pip install -e . with a C++ compiler)")
        return 1
    print(f"# onnxruntime {ort.__version__}; {HEADS} heads, {KV_HEADS} KV heads, head size "
          f"{SIZE}, packed QKV, rotary; median of {5 * args.rounds} calls each\n")
    print("| seq | threads | GroupQueryAttention (us) | CausalAttention (us) | ratio | max diff |")
    print("|---:|---:|---:|---:|---:|---:|")
    for seq in args.seq:
        for threads in args.threads:
            gqa, native, diff = measure(seq, threads, args.rounds)
            print(f"| {seq} | {threads} | {gqa * 1e6:.1f} | {native * 1e6:.1f} | "
                  f"{native / gqa:.2f}x | {diff:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
