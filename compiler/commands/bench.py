"""`dayzero bench ARTIFACT`: latency of an artifact over warm runs.

Warm-up runs first (they pay for lazy initialization, memory-arena growth and caches), then
`--runs` timed calls on the same inputs; the median is the number to compare, p90 shows the
jitter. Inputs are given with --input or generated from the input specs as `dayzero run` does.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

from ..config import options_from_assignments
from ..errors import DayzeroError
from .run import session_setting


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="measure an artifact's latency (median/p90 of warm runs)")
    p.add_argument("artifact", metavar="ARTIFACT")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    p.add_argument("--size", action="append", default=[], metavar="SYMBOL=N",
                   help="size of a symbolic dim for generated inputs")
    p.add_argument("--warmup", type=int, default=5, metavar="N", help="untimed runs first")
    p.add_argument("--runs", type=int, default=50, metavar="N", help="timed runs")
    p.add_argument("--sizes", metavar="[SYMBOL=]N,N,...",
                   help="bench at each of these sizes of a size symbol (the only one, or the one "
                        "named), e.g. --sizes 16,64,256,1024")
    p.add_argument("--plot", metavar="FILE.png",
                   help="with --sizes: draw latency against size (PNG, SVG or PDF)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--session", action="append", default=[], type=session_setting,
                   metavar="KEY=VALUE",
                   help="override a recorded onnxruntime session setting for these runs, as "
                        "`dayzero run --session` (e.g. allow_spinning=true)")
    p.set_defaults(handler=bench_command)


@dataclass(frozen=True)
class BenchResult:
    artifact: str
    backend: str
    inputs: dict[str, list[int]]
    warmup: int
    runs: int
    median_ms: float
    p90_ms: float
    min_ms: float
    mean_ms: float

    def describe(self) -> str:
        shapes = ", ".join(f"{k}{v}" for k, v in self.inputs.items())
        return (f"bench {self.artifact} ({self.backend}), inputs {shapes}: "
                f"{self.warmup} warm-up + {self.runs} runs\n"
                f"  median {self.median_ms:.3f} ms  p90 {self.p90_ms:.3f} ms  "
                f"min {self.min_ms:.3f} ms  mean {self.mean_ms:.3f} ms")


def bench_command(args) -> int:
    import runtime

    from .run import _gather_inputs, _sizes

    if args.runs < 1 or args.warmup < 0:
        raise DayzeroError(f"--runs {args.runs} / --warmup {args.warmup}: need runs >= 1 and "
                           "warmup >= 0", "--runs/--warmup")
    session = options_from_assignments(args.session, "session").get("session")
    model = runtime.load(args.artifact, session=session)
    if hasattr(model, "nproc") and hasattr(model, "last_timing"):  # a LaunchedModel
        raise DayzeroError(
            f"{args.artifact} is partitioned for {model.nproc} ranks: each call from this "
            "process starts them anew (seconds of start-up), so warm runs cannot be timed here",
            args.artifact, f"time warm runs inside the ranks: torchrun --nproc-per-node "
            f"{model.nproc} -m compiler.cli bench {args.artifact}; or `dayzero run "
            f"{args.artifact}`, which reports the run apart from the start-up")
    described = getattr(model, "describe", lambda: None)()
    if described and not args.json:
        print(described)
    if args.plot and not args.sizes:
        raise DayzeroError("--plot draws latency against size: it needs --sizes", "--plot",
                           "add --sizes 16,64,256,1024")
    if args.sizes:
        return _bench_sizes(model, args)
    with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
        inputs = _gather_inputs(model, args.input, _sizes(args.size))
    result = bench(model, inputs, args.warmup, args.runs, str(args.artifact))
    print(json.dumps(asdict(result), indent=1) if args.json else result.describe())
    return 0


def _bench_sizes(model, args) -> int:
    from . import bench_sizes
    from .run import _sizes

    if args.input:
        raise DayzeroError("--sizes generates the inputs of each size, but --input gives them",
                           "--input", "drop --input, or bench one size without --sizes")
    with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
        rows = bench_sizes.bench_sizes(model, args, _sizes(args.size), bench)
    if args.json:
        print(json.dumps([{"symbol": n, "size": size, **asdict(r)} for n, size, r in rows],
                         indent=1))
    else:
        print(bench_sizes.describe(rows))
    if args.plot:
        path = bench_sizes.plot(rows, args.plot, f"{args.artifact}: latency against size")
        print(f"wrote {path}", file=sys.stderr if args.json else sys.stdout)
    return 0


def bench(model, inputs: list[np.ndarray], warmup: int, runs: int, name: str) -> BenchResult:
    """Time `runs` calls of `model(*inputs)` after `warmup` untimed ones."""
    for _ in range(warmup):
        model(*inputs)
    times = np.empty(runs)
    for i in range(runs):
        start = time.perf_counter()
        model(*inputs)
        times[i] = (time.perf_counter() - start) * 1000.0
    backend = getattr(getattr(model, "backend", None), "name", None) or \
        getattr(getattr(model, "artifact", None), "backend", "unknown")  # a rank's model
    return BenchResult(name, backend, {s.name: list(x.shape) for s, x in
                                       zip(model.input_specs, inputs)}, warmup, runs,
                       float(np.median(times)), float(np.percentile(times, 90)),
                       float(times.min()), float(times.mean()))
