"""`dayzero bench ARTIFACT --sizes 16,64,256,1024 [--plot out.png]`: latency against a size.

One artifact serves every size in its symbols' ranges, so how its latency grows with the
sequence length (attention's quadratic term, the point where weights stop dominating) is one
command away. Each size gets fresh generated inputs and its own warm-up; the other symbols
take their --size values (or their defaults, as `dayzero run` picks them).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import DayzeroError


def parse_sizes(text: str, model) -> tuple[str, list[int]]:
    """`SYMBOL=16,64` or, for an artifact with one size symbol, `16,64`: the symbol (or the Dim
    name the user gave it) and the sizes, in order."""
    from .run import _symbols

    name, _, values = text.rpartition("=")
    ranges, aliases = _symbols(model)
    if not name:
        if len(ranges) != 1:
            raise DayzeroError(f"--sizes {text}: the artifact has {len(ranges)} size symbols "
                               f"({', '.join(sorted(ranges)) or 'none'})", "--sizes",
                               "name one, e.g. --sizes s0=16,64,256" if ranges else
                               "this artifact has static shapes: bench it without --sizes")
        name = next(iter(ranges))
    try:
        sizes = [int(v) for v in values.split(",") if v.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 0:
        raise DayzeroError(f"--sizes {text} is not a comma-separated list of sizes", "--sizes",
                           "e.g. --sizes 16,64,256,1024")
    return name, sizes


def bench_sizes(model, args, fixed: dict[str, int], bench) -> list:
    """One BenchResult per size of `--sizes`."""
    from .run import _generated_inputs, _resolve_sizes

    name, sizes = parse_sizes(args.sizes, model)
    rows = []
    for size in sizes:
        inputs = _generated_inputs(model, _resolve_sizes(model, {**fixed, name: size}))
        rows.append((name, size, bench(model, inputs, args.warmup, args.runs,
                                       str(args.artifact))))
    return rows


def describe(rows: list) -> str:
    lines = [f"{'size':>8}  {'median ms':>10}  {'p90 ms':>10}  {'min ms':>10}  inputs"]
    for name, size, r in rows:
        shapes = ", ".join(f"{k}{v}" for k, v in r.inputs.items())
        lines.append(f"{name}={size:<6}  {r.median_ms:>10.3f}  {r.p90_ms:>10.3f}  "
                     f"{r.min_ms:>10.3f}  {shapes}")
    return "\n".join(lines)


def plot(rows: list, path: str, title: str) -> Path:
    """Median latency (p90 as the upper whisker) against size, log-log, to PNG/SVG/PDF."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise DayzeroError("--plot needs matplotlib, which is not installed", "--plot",
                           "pip install matplotlib (or dayzero[plot])") from None
    name = rows[0][0]
    sizes = [size for _, size, _ in rows]
    medians = [r.median_ms for _, _, r in rows]
    upper = [r.p90_ms - r.median_ms for _, _, r in rows]
    fig = Figure(figsize=(8, 5), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.errorbar(sizes, medians, yerr=[[0] * len(upper), upper], marker="o", capsize=3,
                label="median (whisker: p90)")
    if min(sizes) > 0:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
    ax.set_xlabel(f"{name}")
    ax.set_ylabel("latency (ms)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    path = Path(path)
    try:
        fig.savefig(path)
    except (OSError, ValueError) as exc:
        raise DayzeroError(f"cannot write the plot: {exc}", str(path),
                           "give a writable .png, .svg or .pdf path") from None
    return path
