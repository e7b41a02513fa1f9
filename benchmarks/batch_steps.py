"""What continuous batching can gain on this machine: the scheduler alone, and its steps' cost.

The serving benchmark's concurrency-8 targets (throughput >= 4x one request at a time, TPOT
<= 2x one decode) measure how much cheaper a step of several sequences is than that many steps
of one. This script takes the HTTP server and its clients out of the picture: on the artifact
benchmarks/serve.py builds (--workdir, --max-positions), it

1. times the step graph alone (`StepRunner.run`) for decode steps of 1 to 16 sequences and for
   prompt chunks with and without decodes riding along (sequences with --cached tokens each);
2. runs benchmarks/serve.py's seeded request mix through the Scheduler in a closed loop at each
   --concurrency (a finished request is replaced by the next one at once), timing every step,
   and prints tokens/s, the decode-only steps' cost by size, and the prompt steps' share.

    python benchmarks/batch_steps.py                    # after benchmarks/serve.py built it
    python benchmarks/batch_steps.py --concurrency 1,8 --requests 64

Both runs spin (`allow_spinning`), as the serving benchmark's do. Figures belong in
docs/performance.md ("Serving under load").
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
THREADS = 2


@dataclass(frozen=True)
class Step:
    seconds: float
    tokens: int
    sequences: int

    @property
    def decode_only(self) -> bool:
        return self.tokens == self.sequences


def _serve_bench():
    spec = importlib.util.spec_from_file_location("bench_serve", ROOT / "benchmarks" / "serve.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def step_report(label: str, steps: list[Step], generated: int, wall: float) -> list[str]:
    """A closed-loop run's lines: tokens/s, decode-only steps by size (count, median ms), and
    the steps that carried prompt tokens."""
    decode = [s for s in steps if s.decode_only]
    prompt = [s for s in steps if not s.decode_only]
    by_size: dict[int, list[float]] = defaultdict(list)
    for s in decode:
        by_size[s.sequences].append(s.seconds)
    sizes = ", ".join(f"{n}: {len(v)} x {statistics.median(v) * 1e3:.1f} ms"
                      for n, v in sorted(by_size.items()))
    prompt_tokens = sum(s.tokens - s.sequences for s in prompt)
    return [f"{label}: {generated} tokens in {wall:.1f} s = {generated / wall:.1f} tok/s; "
            f"{len(steps)} steps",
            f"  decode-only steps by sequences: {sizes or 'none'}",
            f"  steps with prompt tokens: {len(prompt)}, {sum(s.seconds for s in prompt):.1f} s, "
            f"{prompt_tokens} prompt tokens"]


def closed_loop(model, requests, concurrency: int) -> tuple[list[Step], int, float]:
    """The requests through one Scheduler, `concurrency` at a time, each step timed."""
    from runtime.generation.scheduler import Scheduler, Sequence

    scheduler = Scheduler(model.runner)
    eos = frozenset(int(t) for t in model.spec.eos_token_ids)
    steps: list[Step] = []
    run = scheduler.runner.run

    def timed(parts):
        start = time.perf_counter()
        out = run(parts)
        steps.append(Step(time.perf_counter() - start, sum(len(p.tokens) for p in parts),
                          len(parts)))
        return out

    scheduler.runner.run = timed
    pending, active, generated = deque(requests), set(), 0
    start = time.perf_counter()
    try:
        while pending or not scheduler.idle:
            while pending and len(active) < concurrency:
                req = pending.popleft()
                seq = Sequence(list(req.prompt), req.max_tokens, eos_token_ids=eos)
                scheduler.add(seq)
                active.add(seq)
            for event in scheduler.step():
                generated += 1
                if event.sequence.finished:
                    active.discard(event.sequence)
    finally:
        scheduler.runner.run = run
    return steps, generated, time.perf_counter() - start


def step_costs(model, cached: int, rounds: int = 7) -> list[str]:
    """Median ms of the step graph for decode steps of 1-16 sequences (each after `cached`
    tokens) and for prompt chunks alone and with 7 decodes."""
    from runtime.generation.step import StepPart

    runner, rng = model.runner, np.random.default_rng(0)
    for owner in range(24):
        runner.allocator.grow(owner, cached + 600)

    def parts(decodes: int, prompt: int) -> list:
        out = [StepPart(rng.integers(3, 32000, 1), cached, runner.allocator.tables[i])
               for i in range(decodes)]
        if prompt:
            out.append(StepPart(rng.integers(3, 32000, prompt), 0, runner.allocator.tables[20]))
        return out

    shapes = [(1, 0), (2, 0), (4, 0), (8, 0), (12, 0), (16, 0), (0, 64), (7, 64), (0, 512),
              (7, 512)]
    steps = [parts(decodes, prompt) for decodes, prompt in shapes]
    for step in steps:  # every shape once first: the pool's pages and ORT's buffers settle
        runner.run(step)
    lines = []
    for (decodes, prompt), step in zip(shapes, steps):
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            runner.run(step)
            times.append(time.perf_counter() - start)
        lines.append(f"  {decodes:2d} decodes + {prompt:3d} prompt tokens: "
                     f"{statistics.median(times) * 1e3:7.1f} ms")
    for owner in range(24):
        runner.allocator.release(owner)
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default="/tmp/dayzero-generate-bench")
    p.add_argument("--max-positions", type=int, default=4096 + 64)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--concurrency", default="8,1")
    p.add_argument("--max-tokens", default="32:256")
    p.add_argument("--cached", type=int, default=200, help="cached tokens of each decode")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    serve = _serve_bench()
    artifact = Path(args.workdir) / f"dayzero-{args.max_positions}.dz"
    if not artifact.exists():
        print(f"{artifact} is missing: run benchmarks/serve.py first (it builds it)")
        return 1
    import runtime

    model = runtime.load(str(artifact), session={"intra_op_threads": THREADS,
                                                 "allow_spinning": True})
    for _ in model.stream([3, 4, 5], max_new_tokens=4):  # warm up
        pass
    print(f"# batch steps of {artifact}\n\n## the step graph, sequences after {args.cached} "
          f"cached tokens (median of 7)")
    for line in step_costs(model, args.cached):
        print(line)
    low, high = (int(x) for x in args.max_tokens.split(":"))
    requests = serve.request_mix(args.requests, args.seed, args.max_positions, (low, high))
    print(f"\n## the Scheduler alone, {len(requests)} requests of benchmarks/serve.py's mix, "
          f"closed loop")
    rates = {}
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        steps, generated, wall = closed_loop(model, requests, concurrency)
        rates[concurrency] = generated / wall
        for line in step_report(f"c={concurrency}", steps, generated, wall):
            print(line)
    if 1 in rates:
        for concurrency, rate in rates.items():
            if concurrency != 1:
                print(f"  c={concurrency} / c=1: {rate / rates[1]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
