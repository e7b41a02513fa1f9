"""`generate` time against the number of prompts: is one call linear in N (issue 33, item 7)?

Compiles the tiny Llama decoder of examples/llama.py (hidden 64, vocabulary 256, random
weights, nothing downloaded) once as a generation artifact, then times `generate` on N prompts
of 2 to 6 tokens, each asking for one new token, so the model's own work per prompt is a small
constant and what grows faster than N is the bookkeeping around it (building the requests,
the scheduler's per-step work, assembling the output). Each time is the minimum of
`--repeat` runs.

    python benchmarks/scheduler_scale.py                    # 10^4 and 10^5 prompts
    python benchmarks/scheduler_scale.py --sizes 1000,10000 --workdir /tmp/scale

Prints each size's time (CPU and wall) and per-prompt cost, and the ratio of the two largest
sizes' CPU times against the ratio of their sizes. Target: at most 1.5 x linear, that is 10^5
prompts in at most 15 x the time of 10^4. Exit status 1 when it is missed. The verdict is on
the process's CPU time: on a shared machine wall time also measures the neighbours.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LIMIT = 1.5  # time ratio / size ratio: 15x the time for 10x the prompts
KV_CACHE = "64MiB"


def _llama_example():
    spec = importlib.util.spec_from_file_location("example_llama", ROOT / "examples" / "llama.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(workdir: Path) -> Path:
    """The tiny decoder's generation artifact in `workdir` (compiled once, then reused)."""
    import compiler

    out = workdir / "llama_scale.dz"
    if (out / "manifest.json").is_file():
        return out
    model, args, dynamic = _llama_example().build()
    return compiler.compile(model, args, out=out, dynamic_shapes=dynamic,
                            task="text-generation", force=True,
                            config={"generation": {"kv_cache_memory": KV_CACHE}})


def prompts(count: int, seed: int = 0) -> list[np.ndarray]:
    """`count` seeded prompts of 2 to 6 tokens of the 256-token vocabulary."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, 7, count)
    ids = rng.integers(3, 256, int(lengths.sum()))
    return np.split(ids, np.cumsum(lengths)[:-1])


def time_generate(model, count: int, repeat: int) -> tuple[float, float]:
    """The least CPU and wall seconds of `repeat` `generate` calls on `count` prompts, one new
    token each."""
    batch = prompts(count)
    cpu = wall = float("inf")
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        out = model.generate(batch, max_new_tokens=1, eos_token_id=[])
        cpu = min(cpu, time.process_time() - start_cpu)
        wall = min(wall, time.perf_counter() - start)
        assert out.shape[0] == count
    return cpu, wall


def report(times: dict[int, tuple[float, float]]) -> bool:
    """Print each size's (CPU, wall) seconds and the two largest sizes' CPU time ratio;
    whether it is within LIMIT."""
    for count, (cpu, wall) in sorted(times.items()):
        print(f"{count:>8} prompts: {cpu:8.3f} s CPU ({cpu / count * 1e6:7.1f} us a prompt), "
              f"{wall:8.3f} s wall")
    small, big = sorted(times)[-2:]
    ratio = times[big][0] / times[small][0]
    linear = big / small
    ok = ratio <= LIMIT * linear
    print(f"time ratio {big}/{small}: {ratio:.2f}x for {linear:.0f}x the prompts "
          f"(target <= {LIMIT * linear:.1f}x): {'PASS' if ok else 'FAIL'}")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000",
                        help="comma-separated prompt counts (at least two)")
    parser.add_argument("--repeat", type=int, default=2, help="runs per size (the minimum counts)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the artifact is compiled (default: a temporary folder)")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if len(sizes) < 2 or min(sizes) < 1:
        parser.error("--sizes needs at least two positive counts")
    import runtime

    with tempfile.TemporaryDirectory(prefix="dayzero-scale-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        model = runtime.load(build(workdir))
        time_generate(model, min(sizes), 1)  # warm: the pool, the session's first runs
        times = {count: time_generate(model, count, args.repeat) for count in sizes}
    return 0 if report(times) else 1


if __name__ == "__main__":
    sys.exit(main())
