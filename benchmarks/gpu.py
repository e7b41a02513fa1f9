"""The triton backend on a CUDA GPU against torch.compile (Inductor) and eager, in one run.

Compiles the Llama-style benchmark decoder (examples/llama.py `build_bench` config: hidden 256,
4 layers, 8 heads, 4 KV heads) at batch 8, sequence 512, in fp32 and fp16, with the triton
backend (its default pipeline: causal masks proved, pattern fusion, fusion groups, a memory
plan), then times each contender on the same inputs on the device (outputs stay on the device:
no host copies are timed) and prints median latencies and
the ratio to Inductor (target: <= 1.1x) plus the largest difference from eager.

    python benchmarks/gpu.py                 # both dtypes
    python benchmarks/gpu.py --dtypes fp16 --repeat 50

Without a CUDA device it prints that it is skipped and exits 0 (the CPU interpreter says nothing
about speed). This is a script, not a test: record its figures in docs/performance.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


def _median_ms(fn, repeat: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _model(dtype: torch.dtype, batch: int, seq: int):
    from transformers import LlamaForCausalLM

    from examples.llama import CausalLM, config

    cfg = config(hidden=256, layers=4, heads=8, kv_heads=4, intermediate=688, vocab=1000)
    torch.manual_seed(0)
    model = CausalLM(LlamaForCausalLM(cfg).eval()).to(dtype)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1))
    return model, ids


def bench(dtype_name: str, batch: int, seq: int, repeat: int) -> dict:
    import backends.triton  # noqa: F401  (chooses native Triton before torch imports it)
    import compiler
    import runtime

    model, ids = _model(DTYPES[dtype_name], batch, seq)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        path = compiler.compile(model, (ids,), out=Path(tmp) / "m.dz", backend="triton",
                                passes=None)  # the backend's own pipeline
        loaded = runtime.load(path)
        compile_s = time.perf_counter() - start
    executable = loaded._executable
    model_gpu, ids_gpu = model.cuda(), ids.cuda()
    inductor = torch.compile(model_gpu)
    with torch.no_grad():
        want = model_gpu(ids_gpu).float()
        got = executable.run_tensors([ids_gpu])[0].float()
        inductor(ids_gpu)
        result = {
            "dtype": dtype_name, "compile_s": compile_s,
            "eager_ms": _median_ms(lambda: model_gpu(ids_gpu), repeat),
            "inductor_ms": _median_ms(lambda: inductor(ids_gpu), repeat),
            "triton_ms": _median_ms(lambda: executable.run_tensors([ids_gpu]), repeat),
            "max_abs_diff": (got - want).abs().max().item(),
        }
    result["vs_inductor"] = result["triton_ms"] / result["inductor_ms"]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="fp32,fp16")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/gpu.py: skipped, no CUDA device (GPU figures are still to be measured)")
        return 0
    print(f"# {torch.cuda.get_device_name()} batch {args.batch} seq {args.seq}")
    print(f"{'dtype':6} {'compile s':>9} {'eager ms':>9} {'inductor ms':>11} {'triton ms':>9} "
          f"{'x inductor':>10} {'max diff':>9}")
    for name in args.dtypes.split(","):
        r = bench(name, args.batch, args.seq, args.repeat)
        print(f"{r['dtype']:6} {r['compile_s']:9.1f} {r['eager_ms']:9.2f} {r['inductor_ms']:11.2f} "
              f"{r['triton_ms']:9.2f} {r['vs_inductor']:10.2f} {r['max_abs_diff']:9.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
