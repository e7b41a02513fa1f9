"""The alignment report as one self-contained HTML page: error plots per value and per layer.

No scripts and no external files: two inline SVG plots (max abs error of every compared value
in execution order on a log scale, failing values in red, layers as shaded bands; and the
largest error per layer), the first divergence, and the full table.
"""

from __future__ import annotations

import html
import math

from .align import AlignReport, Check
from .align_text import divergence, summary
from .html_page import page, pre

WIDTH, HEIGHT, PAD = 900, 260, 48
_FLOOR = 1e-12  # exact zeros sit on the plot's floor


def _log(x: float) -> float:
    if not math.isfinite(x):
        return 3.0
    return math.log10(max(x, _FLOOR))


def _y_scale(values: list[float]):
    lo = math.floor(min(values, default=-12.0))
    hi = math.ceil(max(values, default=0.0))
    hi = max(hi, lo + 1)
    return lo, hi, lambda v: PAD / 2 + (HEIGHT - PAD) * (hi - v) / (hi - lo)


def _axis(lo: int, hi: int, y, label: str) -> list[str]:
    parts = [f'<text x="4" y="14" font-size="11">{html.escape(label)}</text>']
    for exp in range(lo, hi + 1):
        parts.append(f'<line x1="{PAD}" x2="{WIDTH - 8}" y1="{y(exp):.1f}" y2="{y(exp):.1f}" '
                     'stroke="#ddd"/>')
        parts.append(f'<text x="{PAD - 4}" y="{y(exp) + 4:.1f}" font-size="10" '
                     f'text-anchor="end">1e{exp}</text>')
    return parts


def value_plot(checks: list[Check]) -> str:
    logs = [_log(c.errors.max_abs) for c in checks]
    lo, hi, y = _y_scale(logs)
    step = (WIDTH - PAD - 16) / max(len(checks) - 1, 1)
    x = lambda i: PAD + 8 + i * step  # noqa: E731
    parts = _bands(checks, x, step)
    parts += _axis(lo, hi, y, "max abs error per value (log scale), in execution order")
    points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(logs))
    parts.append(f'<polyline points="{points}" fill="none" stroke="#79a" stroke-width="1"/>')
    for i, (c, v) in enumerate(zip(checks, logs)):
        color = "#2a7" if c.ok else "#d22"
        title = html.escape(f"%{c.name} {c.op} [{c.layer}]: max abs {c.errors.max_abs:.3g}, "
                            f"cos {c.errors.cosine:.6f}, {'ok' if c.ok else 'FAIL'}")
        parts.append(f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="{3 if c.ok else 5}" '
                     f'fill="{color}"><title>{title}</title></circle>')
    return _svg(parts)


def _runs(checks: list[Check]) -> list[tuple[str, int, int]]:
    """(layer, first index, last index) of each run of consecutive values in one layer."""
    runs: list[tuple[str, int, int]] = []
    for i, c in enumerate(checks):
        if runs and runs[-1][0] == c.layer:
            runs[-1] = (c.layer, runs[-1][1], i)
        else:
            runs.append((c.layer, i, i))
    return runs


def _bands(checks: list[Check], x, step: float) -> list[str]:
    """Every other run of one layer shaded, each labelled under the plot."""
    parts = []
    for k, (layer, first, last) in enumerate(_runs(checks)):
        if k % 2 == 0:
            left, right = x(first) - step / 2, x(last) + step / 2
            parts.append(f'<rect x="{left:.1f}" y="{PAD / 2}" width="{right - left:.1f}" '
                         f'height="{HEIGHT - PAD}" fill="#f3f3f8"/>')
        parts.append(f'<text x="{x(first):.1f}" y="{HEIGHT - 8 - 10 * (k % 2)}" '
                     f'font-size="10">{html.escape(layer)}</text>')
    return parts


def layer_plot(checks: list[Check]) -> str:
    layers: dict[str, list[Check]] = {}
    for c in checks:
        layers.setdefault(c.layer, []).append(c)
    worst = {name: max(_log(c.errors.max_abs) for c in group) for name, group in layers.items()}
    # one decade below the smallest bar, so that every bar shows
    lo, hi, y = _y_scale([*worst.values(), min(worst.values(), default=-12.0) - 1])
    width = (WIDTH - PAD - 16) / max(len(worst), 1)
    parts = _axis(lo, hi, y, "largest max abs error per layer")
    for i, (name, v) in enumerate(worst.items()):
        left = PAD + 8 + i * width
        failed = any(not c.ok for c in layers[name])
        parts.append(f'<rect x="{left + 2:.1f}" y="{y(v):.1f}" width="{width - 4:.1f}" '
                     f'height="{y(lo) - y(v):.1f}" fill="{"#d22" if failed else "#79a"}">'
                     f'<title>{html.escape(name)}: 1e{v:.2f}</title></rect>')
        parts.append(f'<text x="{left + width / 2:.1f}" y="{HEIGHT - 8}" font-size="10" '
                     f'text-anchor="middle">{html.escape(name)}</text>')
    return _svg(parts)


def _svg(parts: list[str]) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}">' + "".join(parts) + "</svg>")


def _row(c: Check) -> str:
    e = c.errors
    cells = [f"%{c.name}", c.op + (f" (fused {len(c.origin)})" if c.origin else ""),
             f"{c.dtype} ({c.precision})", str(list(c.shape)), c.layer, f"{e.max_abs:.3e}",
             f"{e.max_rel:.3e}", f"{e.cosine:.6f}",
             f"{c.threshold.atol:g} / {c.threshold.rtol:g}", "ok" if c.ok else "FAIL",
             c.loc or ""]
    style = "" if c.ok else ' class="fail"'
    return f"<tr{style}>" + "".join(f"<td>{html.escape(x)}</td>" for x in cells) + "</tr>"


def render(report: AlignReport) -> str:
    first = report.first_failure
    head = ["value", "op", "dtype (precision)", "shape", "layer", "max abs", "max rel", "cosine",
            "atol / rtol", "", "source"]
    table = ("<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"
             + "".join(_row(c) for c in report.checks) + "</table>")
    verdict = pre(divergence(report, first), "fail") if first else ""
    return page(f"Alignment: {report.backend} vs reference", pre(summary(report)), verdict,
                value_plot(report.checks), layer_plot(report.checks), table)
