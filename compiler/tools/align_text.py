"""The alignment report as text: a table of compared values, a summary, the first divergence."""

from __future__ import annotations

from compiler.ir import get_op

from .align import AlignReport, Check

# copies of their input (their error is their input's): shown with --all or when they fail
_QUIET_KINDS = frozenset({"view", "creation"})


def format_report(report: AlignReport, all_rows: bool = False) -> str:
    rows = [c for c in report.checks
            if all_rows or not c.ok or get_op(c.op).kind not in _QUIET_KINDS]
    lines = [_table(rows)] if rows else []
    lines.append(summary(report, len(rows)))
    first = report.first_failure
    if first is not None:
        lines.append(divergence(report, first))
    return "\n".join(lines)


def _op_label(check: Check) -> str:
    if check.origin:
        return f"{check.op} (fused {len(check.origin)})"
    return check.op


def _table(rows: list[Check]) -> str:
    header = ["value", "op", "dtype", "shape", "layer", "max_abs", "max_rel", "cosine",
              "atol/rtol", ""]
    body = []
    for c in rows:
        e = c.errors
        dtype = c.dtype if c.precision == c.dtype else f"{c.dtype}({c.precision})"
        body.append([f"%{c.name}", _op_label(c), dtype, _shape(c.shape), c.layer,
                     _g(e.max_abs), _g(e.max_rel), f"{e.cosine:.6f}",
                     f"{c.threshold.atol:g}/{c.threshold.rtol:g}", "ok" if c.ok else "FAIL"])
    widths = [max(len(str(r[i])) for r in [header, *body]) for i in range(len(header))]
    return "\n".join("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip()
                     for row in [header, *body])


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _g(x: float) -> str:
    return f"{x:.2e}"


def summary(report: AlignReport, shown: int | None = None) -> str:
    failed = len(report.failures)
    lines = [f"align {report.backend} vs {report.reference}: {len(report.checks)} values compared"
             f", {failed} above threshold"]
    if shown is not None and shown < len(report.checks):
        lines[0] += f"; not shown: {len(report.checks) - shown} views/constants (--all)"
    if report.unmatched:
        lines[0] += f"; no reference counterpart: {len(report.unmatched)}"
    if report.unobserved:
        lines[0] += f"; not exposed by the backend: {len(report.unobserved)}"
    if report.outputs_only:
        lines.append(f"note: backend {report.backend} cannot expose intermediate values "
                     "(Backend.observe): only the outputs were compared")
    if report.eager_max_abs is not None:
        lines.append(f"reference vs torch eager: outputs max abs err {_g(report.eager_max_abs)}")
    outputs = [c for c in report.checks if c.name in report.output_names]
    if outputs:
        lines.append("outputs: " + ", ".join(f"%{c.name} max abs err {_g(c.errors.max_abs)}"
                                             for c in outputs))
    if report.checks:
        lines.append("largest error per layer: " + ", ".join(
            f"{layer} {_g(err)}" for layer, err in per_layer(report.checks).items()))
        tight = max(report.checks, key=lambda c: c.errors.worst)
        if tight.ok and tight.errors.worst > 0:
            lines.append(f"closest to its threshold: %{tight.name} ({tight.op}, layer "
                         f"{tight.layer}) at {100 * tight.errors.worst:.2g}% of it")
    if report.ok:
        lines.append("OK: every compared value is within its threshold")
    return "\n".join(lines)


def per_layer(checks: list[Check]) -> dict[str, float]:
    """Largest max abs error of each layer, in order of first appearance."""
    worst: dict[str, float] = {}
    for c in checks:
        worst[c.layer] = max(worst.get(c.layer, 0.0), c.errors.max_abs)
    return worst


def divergence(report: AlignReport, first: Check) -> str:
    e, t = first.errors, first.threshold
    lines = [f"FIRST DIVERGENCE at %{first.name} = {first.op} ({first.dtype}{_shape(first.shape)}"
             f", layer {first.layer}): max abs {_g(e.max_abs)}, max rel {_g(e.max_rel)}, "
             f"cosine {e.cosine:.6f}, {e.mismatched} of {e.size} elements outside "
             f"{t.describe()} ({first.op_class} threshold for {first.precision})",
             f"  source: {first.loc or 'unknown'}"]
    if first.origin:
        lines.append(f"  fused from: {', '.join(first.origin)}")
    if first.ref_name != first.name:
        lines.append(f"  compared with reference %{first.ref_name} (matched by {first.rule})")
    after = len(report.failures) - 1
    if after:
        lines.append(f"  {after} later value(s) exceed their thresholds too: errors propagate, "
                     "fix this one first")
    return "\n".join(lines)
