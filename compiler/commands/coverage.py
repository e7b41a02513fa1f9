"""`dayzero coverage SPEC`: the ops a model uses and which backends run them, without compiling.

Exit status 1 when an op has no backend at all (the frontend cannot convert it, or no backend
runs it natively or by fallback).
"""

from __future__ import annotations

import json
import sys

from ..log import StageLog

_SHOW = {"supported": "yes", "fallback": "fallback", "missing": "MISSING"}


def add_parser(sub) -> None:
    p = sub.add_parser("coverage", help="list the ops a model uses and which backends run them")
    p.add_argument("spec", metavar="SPEC", help="path/to/file.py:function")
    p.add_argument("--backend", action="append", metavar="NAME",
                   help="judge only this backend (repeatable; default: every installed one)")
    p.add_argument("--fallback", metavar="NAME",
                   help="count what NAME runs as runnable, as `compile --fallback NAME` does")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--html", metavar="FILE", help="also write the report as one HTML page")
    p.set_defaults(handler=coverage_command)


def coverage_command(args) -> int:
    import backends

    from ..spec import load_spec
    from ..tools.coverage import coverage_report, op_uses
    from ..tools.partial_export import export_partial

    log = StageLog(sys.stderr)
    names = args.backend or backends.available()
    for name in [*(args.backend or ()), *([args.fallback] if args.fallback else [])]:
        backends.get(name)  # an unknown name is an error, not a skipped column
    with log.stage("load", args.spec):
        spec = load_spec(args.spec)
    with log.stage("export", "(no compiling)"):
        partial = export_partial(spec.module, spec.example_inputs, spec.dynamic_shapes)
    report = coverage_report(type(spec.module).__name__, op_uses(partial.graph, partial.missing),
                             names, fallback=args.fallback)
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print(format_report(report))
    if args.html:
        from ..tools import coverage_html
        from ..tools.html_page import write_page

        path = write_page(args.html, coverage_html.render(report, _notes(report),
                                                          _summary(report)))
        print(f"wrote {path}", file=sys.stderr)
    return 1 if report.uncovered() else 0


def _summary(report) -> list[str]:
    return ([f"skipped backend {b}: {why}" for b, why in report.skipped.items()]
            + [report.summary_line(b) for b in report.backends])


def _notes(report) -> list[str]:
    """Why an op falls back or is missing, one line per backend and reason."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for b in report.backends:
        for u in report.ops:
            verdict = report.verdict(u.op, b)
            if verdict.status != "supported" and u.source == "ir":
                grouped.setdefault((b, verdict.detail), []).append(u.op)
    return [f"  {b}: {', '.join(ops)}: {detail}" for (b, detail), ops in grouped.items()]


def format_report(report) -> str:
    header = ["op", "kind", "count", *report.backends, "first use"]
    rows = [[u.op, u.kind, str(u.count),
             *(_SHOW[report.verdict(u.op, b).status] for b in report.backends), u.first]
            for u in report.ops]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines = ["  ".join([*(c.ljust(w) for c, w in zip(row[:-1], widths)), row[-1]])
             for row in [header, *rows]]
    notes = _notes(report)
    if notes:
        lines += ["notes:", *notes]
    lines += _summary(report)
    uncovered = report.uncovered()
    if uncovered:
        lines.append(f"no backend runs: {', '.join(uncovered)} (see the first-use lines above; "
                     "add a converter in compiler/frontend/aten/, or rewrite that line)")
    return "\n".join(lines)
