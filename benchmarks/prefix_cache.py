"""Prefix caching: time to first token of a request whose long prefix is cached, against the
same request computed whole (issue 39, item 1: target <= 0.15x at a 1,000-token prefix).

On benchmarks/generate.py's random Llama checkpoint (about 150M parameters; `--small` takes a
4-layer, hidden-256 one when time is short), compiled once into --workdir, in this process:
each round draws a fresh --prefix-token prefix and two different --suffix-token suffixes;
one request (prefix + first suffix) is timed with the cache off, then, the cache on, the same
prefix with the first suffix fills the cache and the second suffix is timed. Both timed
requests ask for one token, so each time is the prompt's steps and the first token. Printed:
each round's times and ratio, the medians and the median ratio against the target, and the
prompt tokens each timed request computed.

    python benchmarks/prefix_cache.py                        # 150M, 1,000-token prefix
    python benchmarks/prefix_cache.py --small --rounds 3     # a minute or two

Figures belong in docs/performance.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TARGET = 0.15
SMALL = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=704, vocab_size=32000)


def _generate_bench():
    spec = importlib.util.spec_from_file_location("bench_generate",
                                                  ROOT / "benchmarks" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def build(work: Path, small: bool, max_positions: int) -> Path:
    """The checkpoint (generate.py's, or its small shape) and its fp32 artifact, made once."""
    bench = _generate_bench()
    if small:
        bench.SHAPE = SMALL
    folder = bench.make_checkpoint(work / ("small" if small else "ckpt"), max_positions)
    out = work / ("small.dz" if small else "fp32.dz")
    seconds = bench.build_dayzero(folder, out, max_positions, None, reuse=True)
    built = f" ({seconds:.1f} s to build)" if seconds == seconds else " (built earlier)"
    print(f"artifact {out}{built}")
    return out


def first_token_seconds(model, ids: list[int], prefix_cache: bool) -> tuple[float, int]:
    """Seconds from the call to the first token of `ids`, and the tokens its steps computed."""
    model.prefix_cache = prefix_cache
    start = time.perf_counter()
    for _ in model.stream(np.asarray(ids), max_new_tokens=1, eos_token_id=[]):
        seconds = time.perf_counter() - start
    return seconds, model.stats.computed_tokens


def measure(model, prefix: int, suffix: int, rounds: int, vocab: int) -> list[tuple[float, float]]:
    """(uncached, cached) first-token seconds per round, each round its own prefix."""
    rng = np.random.default_rng(0)
    out = []
    first_token_seconds(model, rng.integers(3, vocab, prefix + suffix).tolist(), False)  # warm
    for round_ in range(rounds):
        head = rng.integers(3, vocab, prefix).tolist()
        a, b = (head + rng.integers(3, vocab, suffix).tolist() for _ in range(2))
        cold, cold_tokens = first_token_seconds(model, a, False)
        first_token_seconds(model, a, True)  # fills the cache with the prefix's blocks
        warm, warm_tokens = first_token_seconds(model, b, True)
        print(f"  round {round_ + 1}: uncached {cold * 1e3:8.1f} ms ({cold_tokens} tokens "
              f"computed), cached {warm * 1e3:7.1f} ms ({warm_tokens} tokens computed, "
              f"{model.stats.cached_tokens} cached): {warm / cold:.3f}x")
        out.append((cold, warm))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default="/tmp/dayzero-prefix-cache-bench")
    p.add_argument("--small", action="store_true", help="a 4-layer hidden-256 checkpoint")
    p.add_argument("--prefix", type=int, default=1000)
    p.add_argument("--suffix", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import runtime

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    path = build(work, args.small, max(2048, args.prefix + args.suffix + 16))
    bench = _generate_bench()
    model = runtime.load(path, session=bench.SESSION)
    print(f"prefix {args.prefix} tokens, suffix {args.suffix}, block size "
          f"{model.spec.block_size}, {args.rounds} rounds")
    times = measure(model, args.prefix, args.suffix, args.rounds,
                    (SMALL if args.small else bench.SHAPE)["vocab_size"])
    cold = statistics.median(c for c, _ in times)
    warm = statistics.median(w for _, w in times)
    ratio = statistics.median(w / c for c, w in times)
    verdict = "met" if ratio <= TARGET else "MISSED"
    print(f"TTFT uncached {cold * 1e3:.1f} ms, cached {warm * 1e3:.1f} ms: median ratio "
          f"{ratio:.3f}x (target <= {TARGET}x: {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
