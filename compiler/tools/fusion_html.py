"""`dayzero compile --report --html FILE`: what fusion did, as a page: the patterns that fired,
those tried that never fired with their reasons (nearest misses first) and the first nodes
each reason stopped, with their source lines, and the op counts before
and after, with a bar per changed op."""

from __future__ import annotations

import html

from .html_page import page, pre, table, text

_BAR_WIDTH = 240


def render(report, title: str) -> str:
    """`report` is passes.fusion.report.FusionReport (not imported: the driver hands it over)."""
    before, after = sum(report.before.values()), sum(report.after.values())
    fired = table(["pattern", "fired"], sorted(report.fired.items())) if report.fired \
        else text("no pattern fired")
    missed = table(["pattern", "nodes tried", "nodes", "why it did not match", "node", "source",
                    "code"], _missed_rows(report)) if report.not_fired else ""
    groups = (text(f"fusion groups: {len(report.groups)} kernels covering "
                   f"{sum(report.groups.values())} nodes (largest "
                   f"{max(report.groups.values())})") if report.groups else "")
    return page(title, text(f"fusion: {before} nodes -> {after} nodes"),
                "<h2>Patterns fired</h2>", fired,
                "<h2>Patterns tried that did not fire</h2>" if missed else "", missed,
                "<h2>Op counts (changed ops)</h2>", _counts(report), groups,
                "<h2>As text</h2>", pre(str(report)))


def _missed_rows(report) -> list[tuple]:
    """One row per example node; the pattern and the reason only on their first row."""
    rows = []
    for entry in report.not_fired:
        head: tuple = (entry.rule, entry.tried)
        for group in entry.groups:
            for i, ex in enumerate(group.examples):
                reason = (group.count, group.why()) if i == 0 else ("", "")
                rows.append((*head, *reason, ex.anchor, ex.loc or "", ex.code))
                head = ("", "")
        if entry.more_reasons:
            rows.append((*head, "", f"... and {entry.more_reasons} more reason(s)", "", "", ""))
    return rows


def _counts(report) -> str:
    ops = report.changed()
    if not ops:
        return text("no op count changed")
    top = max(max(report.before[op], report.after[op]) for op in ops) or 1

    def bar(n: int, color: str) -> str:
        width = max(1, round(_BAR_WIDTH * n / top)) if n else 0
        return (f'<svg width="{_BAR_WIDTH}" height="10"><rect width="{width}" height="10" '
                f'fill="{color}"/></svg>')

    rows = "".join(
        f"<tr><td>{html.escape(op)}</td><td class=\"num\">{report.before[op]}</td>"
        f"<td>{bar(report.before[op], '#bbb')}</td><td class=\"num\">{report.after[op]}</td>"
        f"<td>{bar(report.after[op], '#79a')}</td></tr>" for op in ops)
    return ("<table><tr><th>op</th><th>before</th><th></th><th>after</th><th></th></tr>"
            + rows + "</table>")
