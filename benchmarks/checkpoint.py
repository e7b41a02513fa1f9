"""Compiling a checkpoint bigger than the memory bound: peak RSS, load time, first output.

Generates a random Llama-architecture checkpoint of at least `--size-gb` GiB in the Hugging Face
layout (config.json, 2 GiB shards, model.safetensors.index.json) in a temporary folder, then:

1. measures the disk's sequential read bandwidth with O_DIRECT reads of the shards (the physical
   limit for everything below; the page cache is bypassed);
2. compiles the folder with `dayzero compile` in a child process under /usr/bin/time, with the
   shards evicted from the page cache first, and checks its peak RSS against the bound
   max(2 GiB, 0.25 x checkpoint bytes);
3. loads the artifact in a fresh child process (artifact evicted from the page cache: a cold
   start) and times `runtime.load` and the first call on 8 tokens.

Nothing is downloaded or committed; everything is deleted afterwards unless `--keep`. Not run in
CI (minutes, and tens of GB of disk).

    python benchmarks/checkpoint.py                       # 8 GiB fp32, reference backend
    python benchmarks/checkpoint.py --size-gb 1 --backend reference onnxruntime
"""

from __future__ import annotations

import argparse
import json
import math
import mmap
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

GIB = 2**30
SHARD_BYTES = 2 * GIB
ROOT = Path(__file__).resolve().parents[1]


# -- the checkpoint ---------------------------------------------------------------------------

def llama_config(layers: int):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                       num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=8,
                       max_position_embeddings=4096, tie_word_embeddings=False,
                       architectures=["LlamaForCausalLM"], dtype="float32")


def state_shapes(layers: int) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the model's state dict, from the model built on meta."""
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(llama_config(layers))
    return {n: tuple(t.shape) for n, t in model.state_dict().items()}


def layers_for(size_bytes: int, itemsize: int) -> int:
    one, two = (sum(math.prod(s) for s in state_shapes(n).values()) * itemsize for n in (1, 2))
    return max(1, math.ceil((size_bytes - (one - (two - one))) / (two - one)))


def generate(folder: Path, size_bytes: int, dtype: torch.dtype) -> int:
    """Write a random checkpoint of at least `size_bytes`; returns its tensor bytes."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    layers = layers_for(size_bytes, itemsize)
    shapes = state_shapes(layers)
    folder.mkdir(parents=True)
    llama_config(layers).save_pretrained(folder)
    shards, current, used = [], [], 0
    for name, shape in shapes.items():
        nbytes = math.prod(shape) * itemsize
        if current and used + nbytes > SHARD_BYTES:
            shards.append(current)
            current, used = [], 0
        current.append(name)
        used += nbytes
    shards.append(current)
    weight_map, total = {}, 0
    gen = torch.Generator().manual_seed(0)
    for i, names in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        total += _write_shard(folder / file, {n: shapes[n] for n in names}, dtype, gen)
        weight_map.update({n: file for n in names})
        print(f"  wrote {file} ({len(names)} tensors)", flush=True)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return total


def _write_shard(path: Path, shapes: dict, dtype: torch.dtype, gen) -> int:
    tag = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}[dtype]
    itemsize = torch.empty((), dtype=dtype).element_size()
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in shapes.items():
        nbytes = math.prod(shape) * itemsize
        header[name] = {"dtype": tag, "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    chunk = 16 * 2**20
    # one random block per shard, reused: generating 2e9 normal numbers would dominate the run
    block = (torch.randn(chunk, generator=gen) * 0.02).to(dtype)
    ones = torch.ones(chunk, dtype=dtype)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, shape in shapes.items():
            count = math.prod(shape)
            source = ones if name.endswith("norm.weight") else block
            for first in range(0, count, chunk):
                n = min(chunk, count - first)
                f.write(source[:n].view(torch.uint8).numpy().data)
    return offset


# -- measurements -----------------------------------------------------------------------------

def disk_read_bandwidth(files: list[Path]) -> float:
    """GB/s reading `files` with O_DIRECT (no page cache), 16 MiB at a time."""
    block = 16 * 2**20
    buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
    done, start = 0, time.perf_counter()
    for path in files:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
        try:
            while n := os.readv(fd, [buf]):
                done += n
                if n < block:
                    break
        finally:
            os.close(fd)
    return done / (time.perf_counter() - start) / 1e9


def disk_write_bandwidth(folder: Path, size: int = 2 * GIB) -> float:
    """GB/s writing `size` bytes with O_DIRECT (what compiling costs at best: it writes W)."""
    block = 16 * 2**20
    buf = mmap.mmap(-1, block)
    buf.write(os.urandom(block))
    path = folder / "write-test.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_DIRECT", 0), 0o600)
    start = time.perf_counter()
    try:
        for _ in range(size // block):
            os.writev(fd, [buf])
        os.fsync(fd)
    finally:
        os.close(fd)
        elapsed = time.perf_counter() - start
        path.unlink()
    return size / elapsed / 1e9


def evict(folder: Path) -> None:
    """Drop a folder's files from the page cache (clean pages; no root needed)."""
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def timed(cmd: list[str]) -> tuple[float, float, str, str]:
    """Run `cmd` under /usr/bin/time -v: (wall seconds, peak RSS GiB, stdout, stderr)."""
    start = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True,
                          cwd=ROOT)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr[-4000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)[1])
    return wall, rss * 1024 / GIB, proc.stdout, proc.stderr


LOAD_SCRIPT = """
import json, sys, time
t0 = time.perf_counter()
import numpy as np, runtime
t1 = time.perf_counter()
m = runtime.load(sys.argv[1], verify=sys.argv[2])
t2 = time.perf_counter()
out = m(np.zeros((1, 8), dtype=np.int64))[0]
t3 = time.perf_counter()
out = m(np.ones((1, 8), dtype=np.int64))[0]
t4 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "first_s": t3 - t2,
                  "second_s": t4 - t3, "finite": bool(np.isfinite(out).all())}))
"""


def compile_and_load(ckpt: Path, art: Path, backend: str, weight_bytes: int,
                     config: Path | None) -> dict:
    evict(ckpt)
    extra = ["--config", str(config)] if config else []
    wall, rss, _, log = timed([sys.executable, "-m", "compiler.cli", "compile", str(ckpt), "-o",
                               str(art), "--backend", backend, *extra])
    bound = max(2.0, 0.25 * weight_bytes / GIB)
    stages = {m[1]: float(m[2]) for m in re.finditer(r"\[([\w+]+)\] done in ([\d.]+)s", log)}
    result = {"backend": backend, "compile_s": wall, "compile_rss_gib": rss, "stages_s": stages,
              "bound_gib": bound, "within_bound": rss <= bound, "loads": {}}
    print(f"  compile ({backend}): {wall:.1f} s {stages}, peak RSS {rss:.2f} GiB "
          f"(bound {bound:.2f} GiB: {'ok' if rss <= bound else 'EXCEEDED'})", flush=True)
    summary = [line.strip() for line in log.splitlines() if "streamed" in line]
    print(f"  {summary[-1] if summary else 'no streaming summary'}", flush=True)
    for verify in ("size", "full"):
        evict(art)
        _, load_rss, out, _ = timed([sys.executable, "-c", LOAD_SCRIPT, str(art), verify])
        load = json.loads(out.strip().splitlines()[-1]) | {"rss_gib": load_rss}
        result["loads"][verify] = load
        print(f"  load verify={verify}: load {load['load_s']:.2f} s, first output "
              f"{load['first_s']:.2f} s, second {load['second_s']:.2f} s, peak RSS "
              f"{load_rss:.2f} GiB, finite {load['finite']}", flush=True)
    return result


def free_space_check(folder: Path, need: int) -> None:
    for where in sorted({str(folder), "/tmp", str(ROOT)}):
        print(subprocess.run(["df", "-h", where], capture_output=True, text=True).stdout.strip())
    free = shutil.disk_usage(folder).free
    if free < need:
        raise SystemExit(f"{folder} has {free / GIB:.1f} GiB free; this run needs "
                         f"{need / GIB:.1f} GiB (use --dir or a smaller --size-gb)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-gb", type=float, default=8.0, help="checkpoint size (GiB)")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--backend", nargs="+", default=["reference"])
    parser.add_argument("--weight-dtype", choices=["fp32", "bf16", "fp16"], default="fp32",
                        help="precision.weight_dtype of the compile (converted while streaming)")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where to generate")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    args = parser.parse_args(argv)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    size = int(args.size_gb * GIB)
    out_factor = {"fp32": 4, "bf16": 2, "fp16": 2}[args.weight_dtype] / \
        torch.empty((), dtype=dtype).element_size()
    free_space_check(Path(args.dir), int(size * (1 + out_factor * len(args.backend)) * 1.05))
    work = Path(tempfile.mkdtemp(prefix="dz-ckpt-bench-", dir=args.dir))
    try:
        ckpt = work / "checkpoint"
        config = None
        if args.weight_dtype != "fp32":
            config = work / "precision.yaml"
            config.write_text(f"precision: {{weight_dtype: {args.weight_dtype}}}\n")
        start = time.perf_counter()
        weight_bytes = generate(ckpt, size, dtype)
        print(f"generated {weight_bytes / GIB:.2f} GiB checkpoint in "
              f"{time.perf_counter() - start:.0f} s at {ckpt}", flush=True)
        shards = sorted(ckpt.glob("*.safetensors"))
        bandwidth, write = disk_read_bandwidth(shards), disk_write_bandwidth(work)
        print(f"disk bandwidth (O_DIRECT): read {bandwidth:.2f} GB/s, write {write:.2f} GB/s",
              flush=True)
        results = {"checkpoint_gib": weight_bytes / GIB, "dtype": args.dtype,
                   "shards": len(shards), "disk_read_gbps": bandwidth,
                   "disk_write_gbps": write, "cpus": os.cpu_count(),
                   "weight_dtype": args.weight_dtype,
                   "runs": [compile_and_load(ckpt, work / f"{b}.dz", b, weight_bytes, config)
                            for b in args.backend]}
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
        return 0 if all(r["within_bound"] for r in results["runs"]) else 1
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
