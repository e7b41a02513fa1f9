"""Operator coverage: which ops a model uses and, per backend, which it runs, how, or not at all.

The first Day-0 question about a new model on a new target is "what is missing?", asked before
any compiling. The answer is a table of every op the model's exported graph uses (IR ops after
conversion, plus the ATen ops the frontend could not convert), each with its count and the first
source line that uses it, and per backend a verdict:

- supported: the backend runs every node of the op (`Backend.supports`);
- fallback: some nodes are not supported as such, but they run another way, as the compile
  driver would do it: on the `fallback` backend (`compile --fallback NAME`), or as the op's
  decomposition (compiler/ir/ops/fused.py) into ops that run;
- missing: neither. An ATen op the frontend cannot convert is missing on every backend.

Verdicts read only capabilities and node types, so nothing is compiled or run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from compiler.errors import DayzeroError
from compiler.ir import Graph, Node, get_op
from compiler.ir.ops.fused import DECOMPOSITIONS, Emitter, decompose_into

from .partial_export import MissingOp

STATUSES = ("supported", "fallback", "missing")
_MAX_DEPTH = 4  # decompositions of decompositions (gated_mlp -> silu -> sigmoid ...)


@dataclass
class OpUse:
    """One op of the model: an IR op (`source` "ir") or an unconverted ATen op ("aten")."""

    op: str
    source: str
    kind: str
    count: int
    first: str
    nodes: list[Node] = field(default_factory=list, repr=False)


@dataclass(frozen=True)
class Verdict:
    status: str  # one of STATUSES
    detail: str = ""


@dataclass
class CoverageReport:
    model: str
    ops: list[OpUse]
    backends: list[str]
    verdicts: dict[tuple[str, str], Verdict]  # (op, backend) -> verdict
    skipped: dict[str, str] = field(default_factory=dict)  # backend -> why it was not judged

    def verdict(self, op: str, backend: str) -> Verdict:
        return self.verdicts[(op, backend)]

    def missing(self, backend: str) -> list[str]:
        return [u.op for u in self.ops if self.verdict(u.op, backend).status == "missing"]

    def fallbacks(self, backend: str) -> list[str]:
        return [u.op for u in self.ops if self.verdict(u.op, backend).status == "fallback"]

    def uncovered(self) -> list[str]:
        """Ops that no judged backend runs, natively or by fallback (exit status 1)."""
        return [u.op for u in self.ops
                if all(self.verdict(u.op, b).status == "missing" for b in self.backends)]

    def summary_line(self, backend: str) -> str:
        """`coverage onnxruntime: 41/42 ops (97.6%), 1 missing: aten.foo`."""
        total = len(self.ops)
        missing = self.missing(backend)
        covered = total - len(missing)
        percent = 100.0 * covered / total if total else 100.0
        line = f"coverage {backend}: {covered}/{total} ops ({percent:.1f}%)"
        fallbacks = self.fallbacks(backend)
        if fallbacks:
            line += f", {len(fallbacks)} by fallback: {', '.join(fallbacks)}"
        if missing:
            line += f", {len(missing)} missing: {', '.join(missing)}"
        return line

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "backends": self.backends,
            "skipped_backends": self.skipped,
            "ops": [{"op": u.op, "source": u.source, "kind": u.kind, "count": u.count,
                     "first": u.first,
                     "backends": {b: {"status": self.verdict(u.op, b).status,
                                      "detail": self.verdict(u.op, b).detail}
                                  for b in self.backends}} for u in self.ops],
            "summary": {b: {"ops": len(self.ops), "supported": len(self.ops)
                            - len(self.missing(b)) - len(self.fallbacks(b)),
                            "fallback": self.fallbacks(b), "missing": self.missing(b),
                            "line": self.summary_line(b)} for b in self.backends},
            "uncovered": self.uncovered(),
        }


def op_uses(graph: Graph, missing: Sequence[MissingOp]) -> list[OpUse]:
    """IR ops in order of first use, then the unconverted ATen ops."""
    uses: dict[str, OpUse] = {}
    for node in graph.nodes:
        use = uses.get(node.op)
        if use is None:
            uses[node.op] = use = OpUse(node.op, "ir", get_op(node.op).kind, 0,
                                        node.loc or "unknown location")
        use.count += 1
        use.nodes.append(node)
    aten = [OpUse(m.name, "aten", "unconverted", m.count, m.first.describe()) for m in missing]
    return list(uses.values()) + aten


def judge(backend, use: OpUse, fallback=None) -> Verdict:
    """The backend's verdict on one op of the model (see the module docstring); `fallback` is
    the backend given to `compile --fallback`, if any."""
    if use.source == "aten":
        return Verdict("missing", "the frontend has no IR for it (compiler/frontend/aten/)")
    unsupported = [n for n in use.nodes if not backend.supports(n)]
    if not unsupported:
        return Verdict("supported")
    runs = _runs_on(backend, fallback)
    if fallback is not None and all(fallback.supports(n) for n in unsupported):
        return Verdict("fallback", f"runs on {fallback.name} (compile --fallback "
                                   f"{fallback.name})")
    if all(_decomposes_to_supported(runs, n, _MAX_DEPTH) for n in unsupported):
        return Verdict("fallback", "runs as its decomposition into "
                                   f"{', '.join(_decomposition_ops(unsupported[0]))}")
    return Verdict("missing", _why(backend, use, unsupported))


def _runs_on(backend, fallback):
    """`supports` of the backend together with its fallback backend."""
    if fallback is None:
        return backend.supports
    return lambda node: backend.supports(node) or fallback.supports(node)


def _why(backend, use: OpUse, unsupported: list[Node]) -> str:
    caps = backend.capabilities()
    if use.op not in caps.ops:
        reason = "not in the backend's capabilities"
    elif use.op in caps.notes:
        reason = caps.notes[use.op]
    else:
        dtypes = sorted({v.type.dtype.value for n in unsupported for v in [*n.inputs, *n.outputs]
                         if v is not None} - set(caps.dtypes))
        reason = f"dtype {', '.join(dtypes)} not supported" if dtypes else "node not supported"
    if len(unsupported) < use.count:
        reason += f" ({len(unsupported)} of {use.count} nodes, first at {unsupported[0].loc})"
    return reason


def _decomposition(node: Node) -> list[Node] | None:
    if node.op not in DECOMPOSITIONS:
        return None
    emitter = Emitter(Graph(f"decomposed_{node.op}"))
    try:
        decompose_into(emitter, node)
    except (ValueError, KeyError):  # a decomposition that cannot take these attributes
        return None
    return emitter.created


def _decomposition_ops(node: Node) -> list[str]:
    created = _decomposition(node) or []
    return list(dict.fromkeys(n.op for n in created))


def _decomposes_to_supported(supports, node: Node, depth: int) -> bool:
    created = _decomposition(node)
    if created is None or depth == 0:
        return False
    return all(supports(n) or _decomposes_to_supported(supports, n, depth - 1)
               for n in created)


def coverage_report(model_name: str, uses: list[OpUse], names: Sequence[str],
                    fallback: str | None = None) -> CoverageReport:
    """Judge `uses` on each backend in `names` (with `fallback` as `compile --fallback` for
    the others); a backend that cannot start is skipped, and noted."""
    import backends

    helper = backends.get(fallback) if fallback else None
    judged, skipped, verdicts = [], {}, {}
    for name in names:
        try:
            backend = backends.get(name)
        except DayzeroError as exc:
            skipped[name] = exc.what
            continue
        judged.append(name)
        other = helper if name != fallback else None
        for use in uses:
            verdicts[(use.op, name)] = judge(backend, use, other)
    return CoverageReport(model_name, uses, judged, verdicts, skipped)
