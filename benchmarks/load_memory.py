"""Load time and peak resident memory of a generation artifact (issue 36, item 1).

Weights are loaded as stored: the artifact holds PackedLinear's panels and MatMulInt4's tiles as
the kernels read them, so a load maps the safetensors files and makes ONNX Runtime sessions
without transforming or copying weights. This measures it on benchmarks/generate.py's random
Llama-shaped checkpoint (~150M parameters, ~600 MB float32), compiled once into --workdir
(float32, or with --quantize int4 as `quantize: {weights: int4, group_size: 32, activations:
int8}`), then loaded in a fresh process per round. Printed per round: load time (process start
to the first logits), peak resident memory (VmHWM) at the first logits and after a prompt of
--prompt tokens and --new new tokens, the weights' bytes (and of them the int4 codes and
scales), the KV cache bytes used, and peak / (weights + KV used).

    python benchmarks/load_memory.py                  # compile if needed, 3 rounds
    python benchmarks/load_memory.py --rounds 1 --recompile
    python benchmarks/load_memory.py --quantize int4
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

MIB = 2**20


def since_process_start() -> float:
    """Seconds since this process was created (/proc/self/stat's start time)."""
    ticks = os.sysconf("SC_CLK_TCK")
    start = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]) / ticks
    return float(Path("/proc/uptime").read_text().split()[0]) - start


def status(key: str) -> int:
    """A /proc/self/status field in bytes (VmHWM, VmRSS, RssAnon, RssFile)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return -1


def child(path: str, prompt: int, new: int, threads: int) -> dict:
    """One load and run in this (fresh) process; figures as a dict."""
    import runtime

    model = runtime.load(path, session={"intra_op_threads": threads})
    ids = [[3 + (i * 7919) % 30000 for i in range(prompt)]]
    stream = iter(model.stream(ids, max_new_tokens=new, eos_token_id=[]))
    next(stream)  # the first token: the prompt's logits are computed
    first = {"load_s": since_process_start(), "hwm_first": status("VmHWM")}
    for _ in stream:
        pass
    kv = model.stats.peak_blocks * model.runner.layout.block_bytes
    return {**first, "hwm_end": status("VmHWM"), "rss_anon": status("RssAnon"),
            "rss_file": status("RssFile"), "kv_bytes": int(kv)}


def weight_bytes(artifact: Path) -> int:
    return sum(p.stat().st_size for p in (artifact / "weights").glob("*.safetensors"))


def int4_bytes(artifact: Path) -> int:
    """Bytes of the stored int4 codes (u8) and their float16 scales, in whichever layout."""
    from safetensors import safe_open

    itemsize, total = {"U8": 1, "F16": 2}, 0
    for path in (artifact / "weights").glob("*.safetensors"):
        with safe_open(str(path), "np") as f:
            for name in f.keys():
                piece = f.get_slice(name)
                total += math.prod(piece.get_shape()) * itemsize.get(piece.get_dtype(), 0)
    return total


QUANTIZE = {"none": "", "int4": "quantize: {weights: int4, group_size: 32, activations: int8}\n"}


def compile_artifact(checkpoint: Path, out: Path, threads: int, quantize: str) -> float:
    config = out.with_suffix(".yaml")
    config.write_text("generation: {kv_cache_memory: 1GiB, prefill_chunk: 512, "
                      "max_batch_tokens: 2048}\n" + QUANTIZE[quantize])
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "compiler.cli", "compile", str(checkpoint), "-o",
                    str(out), "--seq-len", "2:1024", "--config", str(config), "--force", "-q",
                    "--backend-option", f"session.intra_op_threads={threads}"],
                   check=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="/tmp/dayzero-load-memory")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--recompile", action="store_true")
    parser.add_argument("--quantize", choices=sorted(QUANTIZE), default="none",
                        help="int4: int4 weights with int8 activations (MatMulInt4's tiles)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.prompt, args.new, args.threads)))
        return 0
    from generate import make_checkpoint

    work = Path(args.workdir)
    checkpoint = make_checkpoint(work / "checkpoint", 1024)
    artifact = work / ("fp32.dz" if args.quantize == "none" else f"{args.quantize}.dz")
    if args.recompile or not (artifact / "manifest.json").is_file():
        seconds = compile_artifact(checkpoint, artifact, args.threads, args.quantize)
        print(f"compiled in {seconds:.1f} s")
    weights = weight_bytes(artifact)
    print(f"weights: {weights / MIB:.0f} MiB in {artifact}/weights, of which int4 codes and "
          f"scales {int4_bytes(artifact) / MIB:.0f} MiB")
    for index in range(args.rounds):
        out = subprocess.run([sys.executable, __file__, "--child", str(artifact), "--prompt",
                              str(args.prompt), "--new", str(args.new), "--threads",
                              str(args.threads)], check=True, capture_output=True, text=True,
                             env=dict(os.environ, PYTHONPATH=str(ROOT)))
        r = json.loads(out.stdout.strip().splitlines()[-1])
        base = weights + r["kv_bytes"]
        print(f"round {index + 1}: load to first logits {r['load_s']:.2f} s; VmHWM at first "
              f"logits {r['hwm_first'] / MIB:.0f} MiB, after {args.prompt}+{args.new} tokens "
              f"{r['hwm_end'] / MIB:.0f} MiB ({r['hwm_end'] / base:.2f} x weights + KV used "
              f"{r['kv_bytes'] / MIB:.0f} MiB); RssAnon {r['rss_anon'] / MIB:.0f} MiB, "
              f"RssFile {r['rss_file'] / MIB:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
