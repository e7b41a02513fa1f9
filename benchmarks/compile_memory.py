"""Compile memory and time of a real-shaped checkpoint at every precision (issue 36, item 2).

Writes a random bf16 checkpoint with Llama-3.2-1B's shapes (hidden 2048, 16 layers, 32/8
heads, ffn 8192, vocab 128256, tied embeddings; three safetensors shards, 2.5 GB) once into a
work folder, then compiles it in a fresh child process (`nice -n 10`, shards evicted from the
page cache first) at each precision asked: fp32 (`--weight-dtype fp32`), bf16 (its own),
int8 and int4 (`--quantize`). For each it prints the child's peak resident memory (VmHWM),
its wall time, the memory at the end of each compile stage, and checks them against

    peak <= 1.5 GB + the largest single tensor in float32
    time <= 2 x (read + write + hash of the checkpoint's bytes, measured in this run) + 30 s

Nothing is downloaded or committed; the work folder is deleted afterwards unless `--keep`.
Needs 8 GB of free disk (skips with a message otherwise). Not run in CI (minutes).

    python benchmarks/compile_memory.py                          # fp32 bf16 int8 int4
    python benchmarks/compile_memory.py --precision int4 --keep --dir /tmp/dz-mem
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GB = 10**9
ROOT = Path(__file__).resolve().parents[1]
NEED_FREE = 8 * GB
LLAMA_1B = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
            "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
            "tie_word_embeddings": True, "max_position_embeddings": 131072,
            "rope_theta": 500000.0, "rms_norm_eps": 1e-5}
# the compile flags of each precision
PRECISIONS = {"fp32": ["--weight-dtype", "fp32"], "bf16": ["--weight-dtype", "bf16"],
              "int8": ["--quantize", "int8"], "int4": ["--quantize", "int4"]}

# Runs in the child: the CLI in-process, with each stage line stamped with the process's
# resident and peak memory, and VmHWM printed last (the peak of this process alone).
CHILD = r"""
import sys, time
def status():
    out = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out
class Stamped:
    def __init__(self, inner):
        self.inner, self.start = inner, time.perf_counter()
    def write(self, text):
        if "done in" in text:
            s = status()
            text = text.rstrip("\n") + (f"  [rss {s['VmRSS'] / 1e9:.2f} GB, peak "
                                        f"{s['VmHWM'] / 1e9:.2f} GB]\n")
        return self.inner.write(text)
    def __getattr__(self, name):
        return getattr(self.inner, name)
sys.stderr = Stamped(sys.stderr)
from compiler.cli import main
try:
    code = main(sys.argv[1:])
finally:
    print(f"VMHWM {status()['VmHWM']}", file=sys.__stderr__, flush=True)
sys.exit(code)
"""


def llama_1b_shapes() -> dict[str, tuple[int, ...]]:
    """The state dict's names and shapes (tied head: no lm_head.weight stored)."""
    c = LLAMA_1B
    h, f, kv = c["hidden_size"], c["intermediate_size"], c["num_key_value_heads"]
    head = h // c["num_attention_heads"]
    shapes = {"model.embed_tokens.weight": (c["vocab_size"], h)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (h, h),
                   p + "self_attn.k_proj.weight": (kv * head, h),
                   p + "self_attn.v_proj.weight": (kv * head, h),
                   p + "self_attn.o_proj.weight": (h, h),
                   p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
                   p + "mlp.down_proj.weight": (h, f),
                   p + "input_layernorm.weight": (h,),
                   p + "post_attention_layernorm.weight": (h,)}
    shapes["model.norm.weight"] = (h,)
    return shapes


def write_checkpoint(folder: Path, shapes: dict[str, tuple[int, ...]], shards: int = 3) -> int:
    """A random bf16 checkpoint in the Hub's layout (config, index, `shards` files); returns
    its tensor bytes."""
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from checkpoint import _write_shard  # noqa: PLC0415  (a sibling script)

    folder.mkdir(parents=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "torch_dtype": "bfloat16", "hidden_act": "silu", "bos_token_id": 128000,
              "eos_token_id": 128001, **LLAMA_1B}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    total = sum(math.prod(s) for s in shapes.values()) * 2
    groups, current, used = [], [], 0
    for name, shape in shapes.items():
        if current and used >= total * (len(groups) + 1) / shards:
            groups.append(current)
            current = []
        current.append(name)
        used += math.prod(shape) * 2
    groups.append(current)
    weight_map, gen = {}, torch.Generator().manual_seed(0)
    for i, names in enumerate(groups):
        file = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        _write_shard(folder / file, {n: shapes[n] for n in names}, torch.bfloat16, gen)
        weight_map |= {n: file for n in names}
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return total


def evict(folder: Path) -> None:
    """Drop a folder's files from the page cache: benchmarks/checkpoint.py's `evict`."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_checkpoint", Path(__file__).with_name("checkpoint.py"))
    checkpoint = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checkpoint)
    checkpoint.evict(folder)


def read_write_hash(ckpt: Path, out: Path, chunk: int = 64 * 2**20) -> float:
    """Seconds to read the checkpoint's shards (evicted first), hash and write their bytes:
    the floor of a compile that streams them once."""
    evict(ckpt)
    start = time.perf_counter()
    for shard in sorted(ckpt.glob("*.safetensors")):
        digest = hashlib.sha256()
        with open(shard, "rb") as src, open(out, "wb") as dst:
            while data := src.read(chunk):
                digest.update(data)
                dst.write(data)
        out.unlink()
    return time.perf_counter() - start


def compile_once(ckpt: Path, art: Path, precision: str) -> dict:
    """One compile in a fresh `nice -n 10` child: wall seconds, peak bytes, stage lines."""
    evict(ckpt)
    cmd = ["nice", "-n", "10", sys.executable, "-c", CHILD, "compile", str(ckpt), "-o",
           str(art), *PRECISIONS[precision]]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"compile at {precision} failed:\n{proc.stdout[-2000:]}\n"
                         f"{proc.stderr[-4000:]}")
    lines = proc.stderr.splitlines()
    peak = int(next(ln for ln in reversed(lines) if ln.startswith("VMHWM")).split()[1])
    stages = [ln.strip() for ln in lines if "done in" in ln or "streamed" in ln]
    size = sum(p.stat().st_size for p in art.rglob("*") if p.is_file())
    shutil.rmtree(art, ignore_errors=True)
    return {"precision": precision, "wall_s": wall, "peak_bytes": peak, "stages": stages,
            "artifact_bytes": size}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--precision", nargs="+", choices=list(PRECISIONS),
                        default=list(PRECISIONS))
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where to write")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args(argv)
    free = shutil.disk_usage(args.dir).free
    if free < NEED_FREE:
        print(f"skipped: {args.dir} has {free / GB:.1f} GB free, this benchmark needs "
              f"{NEED_FREE / GB:.0f} GB (use --dir)")
        return 0
    work = Path(args.dir) / "dz-compile-memory"
    try:
        return _run(work, args)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _run(work: Path, args) -> int:
    shapes = llama_1b_shapes()
    ckpt = work / "checkpoint"
    if not (ckpt / "model.safetensors.index.json").exists():
        shutil.rmtree(ckpt, ignore_errors=True)
        start = time.perf_counter()
        total = write_checkpoint(ckpt, shapes)
        print(f"wrote {total / GB:.2f} GB bf16 checkpoint in {time.perf_counter() - start:.0f}"
              f" s at {ckpt}", flush=True)
    total = sum(math.prod(s) for s in shapes.values()) * 2
    largest = max(math.prod(s) for s in shapes.values()) * 4
    floor = read_write_hash(ckpt, work / "copy.bin")
    peak_bound, time_bound = 1.5 * GB + largest, 2 * floor + 30
    print(f"checkpoint {total / GB:.2f} GB; largest tensor in float32 {largest / GB:.2f} GB; "
          f"read+write+hash {floor:.1f} s ({total / floor / 1e6:.0f} MB/s)\n"
          f"targets: peak <= {peak_bound / GB:.2f} GB, time <= {time_bound:.0f} s", flush=True)
    runs, ok = [], True
    for precision in args.precision:
        run = compile_once(ckpt, work / f"{precision}.dz", precision)
        fits = run["peak_bytes"] <= peak_bound and run["wall_s"] <= time_bound
        ok &= fits
        runs.append(run | {"within_targets": fits})
        print(f"{precision}: peak {run['peak_bytes'] / GB:.2f} GB, wall {run['wall_s']:.0f} s, "
              f"artifact {run['artifact_bytes'] / GB:.2f} GB: {'ok' if fits else 'MISSED'}",
              flush=True)
        for line in run["stages"]:
            print(f"    {line}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"checkpoint_bytes": total, "largest_fp32_bytes": largest, "floor_s": floor,
             "peak_bound_bytes": peak_bound, "time_bound_s": time_bound, "runs": runs},
            indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
