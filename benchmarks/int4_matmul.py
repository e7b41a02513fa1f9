"""dayzero's ai.dayzero.MatMulInt4 against ONNX Runtime's MatMulNBits on one decoder's products.

The products are those of the generation benchmark's 150M Llama (hidden 1024, 8 layers, merged
QKV 1536 and gate/up 5632 outputs, down 2816 -> 1024, lm_head 32000), int4 in groups of 32
with int8 activations (MatMulNBits' accuracy_level 4, what ORT GenAI's `-p int4` builds). Two
sessions, one per kernel, over the same random codes and scales, alternate in rounds in one
process, so both see the same machine; the ratio printed is the median of the rounds' ratios
(with quartiles), and the bytes each kernel reads per call give the bandwidth each reaches.

    python benchmarks/int4_matmul.py [--rows 1,8,128] [--rounds 30] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LAYER = [(1024, 1536), (1024, 1024), (1024, 5632), (2816, 1024)]  # (in, out): qkv, o, gate/up, down
SHAPES = LAYER * 8 + [(1024, 32000)]


def session(native: bool, threads: int, seed: int = 0):
    from onnx import TensorProto, helper, numpy_helper

    from backends.onnxruntime import native_ops
    from backends.onnxruntime.convert_int4 import tile_layout
    from backends.onnxruntime.ort_module import ort  # telemetry off (issue 33)
    from backends.onnxruntime.session import SessionConfig, session_options

    rng = np.random.default_rng(seed)
    nodes, inits, outputs, inputs = [], [], [], {}
    for i, (k, n) in enumerate(SHAPES):
        inputs[k] = f"x{k}"
        codes = rng.integers(0, 256, (n, k // 32, 16), dtype=np.uint8)
        scales = (rng.random(n * k // 32, dtype=np.float32) + 0.5) * 0.01
        if native:  # float16 scales, as quantize_weights stores a float32 model's
            codes, scales = tile_layout(codes, scales.astype(np.float16))
            node = helper.make_node("MatMulInt4", [inputs[k], f"w{i}", f"s{i}"], [f"y{i}"],
                                    domain=native_ops.DOMAIN)
        else:
            node = helper.make_node("MatMulNBits", [inputs[k], f"w{i}", f"s{i}"], [f"y{i}"],
                                    domain="com.microsoft", K=k, N=n, bits=4, block_size=32,
                                    accuracy_level=4)
        nodes.append(node)
        inits += [numpy_helper.from_array(codes, f"w{i}"), numpy_helper.from_array(scales, f"s{i}")]
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["m", n]))
    graph = helper.make_graph(
        nodes, "products",
        [helper.make_tensor_value_info(v, TensorProto.FLOAT, ["m", k]) for k, v in inputs.items()],
        outputs, inits)
    model = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1),
        helper.make_opsetid(native_ops.DOMAIN, 1)])
    options = session_options(SessionConfig(intra_op_threads=threads, allow_spinning=True))
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"]), inputs


def bytes_read(native: bool) -> int:
    """Weight bytes per call, per 32 weights: the codes and a float16 scale for MatMulInt4;
    for MatMulNBits its packed codes, a float32 scale and a per-block sum."""
    per_block = 16 + 2 if native else 16 + 4 + 4
    return sum(k // 32 * n * per_block for k, n in SHAPES)


def measure(sessions: dict, rows: int, rounds: int, per_round: int = 5) -> dict:
    rng = np.random.default_rng(rows)
    times = {name: [] for name in sessions}
    ratios = []
    for _ in range(rounds):
        medians = {}
        for name, (s, inputs) in sessions.items():
            feed = {v: rng.standard_normal((rows, k), dtype=np.float32)
                    for k, v in inputs.items()}
            s.run(None, feed)
            local = []
            for _ in range(per_round):
                start = time.perf_counter()
                s.run(None, feed)
                local.append(time.perf_counter() - start)
            times[name] += local
            medians[name] = float(np.median(local))
        ratios.append(medians["MatMulInt4"] / medians["MatMulNBits"])
    return {"times": times, "ratios": ratios}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,8,128")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    from backends.onnxruntime import native_ops

    if native_ops.library() is None:
        print("dayzero's native library is not built (pip install -e . builds it)")
        return 1
    sessions = {"MatMulInt4": session(True, args.threads),
                "MatMulNBits": session(False, args.threads)}
    print(f"# {len(SHAPES)} int4 products of the 150M decoder, {args.threads} threads, "
          f"{args.rounds} alternating rounds")
    for rows in (int(r) for r in args.rows.split(",")):
        result = measure(sessions, rows, args.rounds)
        ratios = np.array(result["ratios"])
        line = [f"rows {rows:4d}:"]
        for name, values in result["times"].items():
            median = float(np.median(values))
            rate = bytes_read(name == "MatMulInt4") / median / 1e9
            line.append(f"{name} {median * 1e3:7.2f} ms ({rate:4.1f} GB/s of weights)")
        line.append(f"ratio {np.median(ratios):.3f} (quartiles {np.percentile(ratios, 25):.3f}"
                    f"-{np.percentile(ratios, 75):.3f})")
        print("  ".join(line))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
