"""`dayzero coverage --html FILE`: the coverage table as a page, verdicts colored."""

from __future__ import annotations

from .coverage import CoverageReport
from .html_page import page, pre, table, text

_SHOW = {"supported": ("yes", "ok"), "fallback": ("fallback", "warn"),
         "missing": ("MISSING", "fail")}


def render(report: CoverageReport, notes: list[str], summary: list[str]) -> str:
    backends = list(report.backends)
    rows = [[u.op, u.kind, u.count, *(_SHOW[report.verdict(u.op, b).status][0]
                                      for b in backends), u.first] for u in report.ops]
    first_backend = 3

    def color(row, col, value) -> str:
        if first_backend <= col < first_backend + len(backends):
            return next(css for shown, css in _SHOW.values() if shown == value)
        return ""

    uncovered = report.uncovered()
    verdict = (pre(f"no backend runs: {', '.join(uncovered)}", "fail") if uncovered
               else text("every op runs on at least one backend"))
    return page(f"dayzero coverage: {report.model}", verdict,
                table(["op", "kind", "count", *backends, "first use"], rows, color),
                pre("\n".join(summary)), pre("\n".join(notes)) if notes else "")
