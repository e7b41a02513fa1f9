"""The arena over time as a picture: users look at a plan rather than read it.

Each buffer is a rectangle: across, the steps it is live (node indices in execution order); up,
the bytes it occupies in the arena. The line under the rectangles' skyline is the bytes live at
each step, whose maximum is the lower bound; the dashed line is the arena's size. Gaps between
rectangles under the arena line are fragmentation. Drawn with matplotlib's object API (no pyplot
global state); matplotlib is imported only here, when a plot is asked for.
"""

from __future__ import annotations

from pathlib import Path

from compiler.errors import DayzeroError

from .plan import MemoryPlan
from .report import human_bytes, ratio

LABELLED = 12  # the largest buffers get their value name written on them


def plot_plan(plan: MemoryPlan, path: str | Path, title: str = "memory plan") -> Path:
    """Draw `plan` to an image file (PNG, SVG or PDF by suffix) and return its path."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.collections import PatchCollection
        from matplotlib.figure import Figure
        from matplotlib.patches import Rectangle
    except ImportError:
        raise DayzeroError("--plot needs matplotlib, which is not installed", "--plot",
                           "pip install matplotlib (or dayzero[plot])") from None
    path = Path(path)
    scale, unit = _unit(max(plan.arena_bytes, plan.lower_bound, 1))
    fig = Figure(figsize=(12, 6.5), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    rects = [Rectangle((b.first - 0.45, b.offset / scale), b.last - b.first + 0.9,
                       b.size / scale) for b in plan.buffers if b.size]
    colors = [_color(i) for i, b in enumerate(plan.buffers) if b.size]
    ax.add_collection(PatchCollection(rects, facecolors=colors, edgecolors="white",
                                      linewidths=0.4))
    live = plan.live_bytes()
    ax.step(range(len(live)), [v / scale for v in live], where="mid", color="black",
            linewidth=0.8, alpha=0.55, label="bytes live at each step (max = lower bound)")
    ax.axhline(plan.arena_bytes / scale, color="crimson", linestyle="--", linewidth=1.2,
               label=f"arena {human_bytes(plan.arena_bytes)}")
    _label_largest(ax, plan, scale)
    ax.set_xlim(-1, max(plan.steps, 1))
    ax.set_ylim(0, max(plan.arena_bytes, 1) / scale * 1.08)
    ax.set_xlabel("step (node index in execution order)")
    ax.set_ylabel(f"arena offset ({unit})")
    ax.set_title(f"{title}: arena {human_bytes(plan.arena_bytes)}, lower bound "
                 f"{human_bytes(plan.lower_bound)} (x{ratio(plan.arena_bytes, plan.lower_bound)}"
                 f"), naive {human_bytes(plan.naive_total)} "
                 f"(x{ratio(plan.arena_bytes, plan.naive_total)}); planner {plan.algorithm}",
                 fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=2, fontsize=8,
              frameon=False)
    ax.grid(axis="y", alpha=0.25)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def _label_largest(ax, plan: MemoryPlan, scale: float) -> None:
    by_area = sorted(plan.buffers, key=lambda b: -b.size * (b.last - b.first + 1))
    for b in by_area[:LABELLED]:
        ax.text(b.first + (b.last - b.first) / 2, (b.offset + b.size / 2) / scale,
                "%" + b.value, ha="center", va="center", fontsize=7, clip_on=True)


def _unit(nbytes: int) -> tuple[float, str]:
    for scale, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if nbytes >= 2 * scale:
            return float(scale), unit
    return 1.0, "B"


_PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
            "#ff9da7", "#9c755f", "#bab0ac")


def _color(index: int) -> str:
    return _PALETTE[index % len(_PALETTE)]
