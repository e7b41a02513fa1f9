"""A model with more than 2 GB of weights compiles to an onnxruntime artifact and runs.

ONNX's protobuf cannot hold more than 2 GB, so this only works because model.onnx refers to the
weights in the artifact's safetensors files as external data. The weights are random, generated
here (nothing is downloaded or committed); the artifact is written to a temporary folder and
deleted afterwards. Prints the sizes, times and memory, and checks the output against eager.

    python benchmarks/large_weights.py               # 9 x Linear(8192, 8192): 2.25 GiB fp32
    python benchmarks/large_weights.py --layers 3    # a quicker 0.75 GiB run
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import compiler  # noqa: E402
import runtime  # noqa: E402

GIB = 2**30


def rss_gib() -> float:
    """Resident memory of this process, from /proc (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / GIB
    return float("nan")


class Tower(nn.Module):
    """Square linear layers with a tanh between them (keeps activations bounded)."""

    def __init__(self, layers: int, width: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=9)
    parser.add_argument("--width", type=int, default=8192)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    with torch.no_grad():
        model = Tower(args.layers, args.width).eval()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    x = torch.randn(4, args.width)
    with torch.no_grad():
        want = model(x).numpy()
    print(f"weights: {weight_bytes / GIB:.2f} GiB ({weight_bytes} bytes; protobuf's limit is "
          f"{2**31} bytes)")
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        path = compiler.compile(model, (x,), out=Path(tmp) / "large.dz", backend="onnxruntime")
        compile_s = time.perf_counter() - start
        del model
        onnx_bytes = (path / "backend" / "model.onnx").stat().st_size
        shards = sorted(path.glob("weights/*.safetensors"))
        stored = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        print(f"compile: {compile_s:.1f}s; model.onnx {onnx_bytes} bytes; "
              f"{len(shards)} safetensors shard(s); artifact {stored / GIB:.2f} GiB in all "
              f"({stored / weight_bytes:.3f}x the weights)")
        before = rss_gib()
        start = time.perf_counter()
        loaded = runtime.load(path, verify="size")
        load_s = time.perf_counter() - start
        print(f"load: {load_s:.1f}s; resident memory {before:.2f} -> {rss_gib():.2f} GiB")
        start = time.perf_counter()
        (got,) = loaded(x.numpy())
        run_s = time.perf_counter() - start
        diff = float(np.max(np.abs(got - want)))
        print(f"run: {run_s * 1e3:.0f} ms; max abs diff vs eager {diff:.1e}")
        del loaded
    return 0 if diff < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
