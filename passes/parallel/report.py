"""The communication report: per rank, every collective and the bytes it moves per forward pass.

`bytes` is the payload: the tensor the op works on as this rank holds it (all_reduce,
reduce_scatter and send: the operand; all_gather and recv: the result). `wire_bytes` is what the
rank itself puts on the wire with ring algorithms: 2(n-1)/n of the payload for all_reduce,
(n-1)/n for all_gather and reduce_scatter, the whole tensor for send, nothing for recv. Sizes are
expressions in the size symbols (`256*s0`): they hold for every input size the artifact accepts.

The expert-parallel all-to-alls move as many rows as the routing sends to each rank, a size
symbol of its own (`ep_rows0`): `expert_dispatch`'s payload is the rows the rank receives,
`expert_combine`'s the rows it sends back; their wire is (n-1)/n of that (the share that
crosses ranks when the routing spreads evenly), plus, for the combine, the all-gather of the
token slices ((n-1)/n of its [tokens, hidden] result).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sympy

from compiler.ir import Graph, Node
from compiler.ir.ops.collective import COMMUNICATION_OPS
from compiler.ir.symbolic import normalize

_RESULT_PAYLOAD = {"all_gather", "recv", "expert_dispatch"}


def _bytes(value) -> sympy.Expr:
    size = sympy.Integer(value.type.dtype.itemsize)
    for dim in value.type.shape:
        size *= dim
    return size


def _wire(node: Node, payload) -> sympy.Expr:
    if node.op == "send":
        return payload
    if node.op == "recv":
        return sympy.Integer(0)
    n = len(node.attrs.get("ranks") or [0])
    factor = sympy.Rational(2 * (n - 1), n) if node.op == "all_reduce" else \
        sympy.Rational(n - 1, n)
    if node.op == "expert_combine":  # the rows go back, then the token slices are gathered
        return (payload + _bytes(node.outputs[0])) * factor
    return payload * factor


def _text(expr) -> str | int:
    expr = normalize(sympy.simplify(expr))
    return expr if isinstance(expr, int) else str(expr)


def collectives(graph: Graph) -> list[dict[str, Any]]:
    """The communication ops of one rank's graph, in execution order."""
    entries = []
    for node in graph.nodes:
        if node.op not in COMMUNICATION_OPS:
            continue
        value = node.outputs[0] if node.op in _RESULT_PAYLOAD else node.inputs[0]
        payload = _bytes(value)
        entry = {"op": node.op, "value": node.outputs[0].name, "type": str(value.type),
                 "bytes": _text(payload), "wire_bytes": _text(_wire(node, payload))}
        if "axis" in node.attrs:
            entry["axis"], entry["ranks"] = node.attrs["axis"], node.attrs["ranks"]
        else:
            entry["peer"] = node.attrs["peer"]
        entries.append(entry)
    return entries


def communication_report(graphs: Mapping[int, Graph]) -> dict[str, Any]:
    """Per rank: its collectives, counts and bytes by op, and totals; then totals over ranks."""
    ranks, total, total_wire, count = [], sympy.Integer(0), sympy.Integer(0), 0
    for rank in sorted(graphs):
        entries = collectives(graphs[rank])
        by_op: dict[str, dict[str, Any]] = {}
        for e in entries:
            slot = by_op.setdefault(e["op"], {"count": 0, "bytes": sympy.Integer(0)})
            slot["count"] += 1
            slot["bytes"] += sympy.sympify(e["bytes"])
        mine = sum((sympy.sympify(e["bytes"]) for e in entries), sympy.Integer(0))
        wire = sum((sympy.sympify(e["wire_bytes"]) for e in entries), sympy.Integer(0))
        ranks.append({"rank": rank, "count": len(entries), "bytes": _text(mine),
                      "wire_bytes": _text(wire),
                      "by_op": {op: {"count": s["count"], "bytes": _text(s["bytes"])}
                                for op, s in sorted(by_op.items())},
                      "collectives": entries})
        total, total_wire, count = total + mine, total_wire + wire, count + len(entries)
    return {"ranks": ranks, "total": {"count": count, "bytes": _text(total),
                                      "wire_bytes": _text(total_wire)}}


def format_report(report: Mapping[str, Any], detail: bool = True) -> str:
    """The report as text lines (what `dayzero inspect` prints)."""
    lines = ["# communication per forward pass (bytes: payload as the rank holds it; "
             "wire: sent by the rank, ring algorithms)"]
    for entry in report["ranks"]:
        ops = ", ".join(f"{op} x{s['count']} ({s['bytes']} B)" for op, s in entry["by_op"].items())
        lines.append(f"rank {entry['rank']}: {entry['count']} collectives, {entry['bytes']} B, "
                     f"wire {entry['wire_bytes']} B" + (f": {ops}" if ops else ""))
        if detail:
            for c in entry["collectives"]:
                where = f"{c['axis']} {c['ranks']}" if "axis" in c else f"peer {c['peer']}"
                lines.append(f"    {c['op']:<14} %{c['value']}: {c['type']} over {where}: "
                             f"{c['bytes']} B")
    t = report["total"]
    lines.append(f"total: {t['count']} collectives, {t['bytes']} B, wire {t['wire_bytes']} B")
    return "\n".join(lines)
