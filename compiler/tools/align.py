"""Layer-by-layer numerical alignment of a compiled model against the reference interpreter.

The Day-0 practice: run the model on the target and on a trusted reference with the same inputs,
compare every intermediate value both produce, and find the *first* place they part. Errors
propagate, so every value after the first bad one is bad too; the first one names the op and the
source line to look at.

- The reference runs the reference graph with `backends.reference.interpreter` (torch eager, op
  by op). For a SPEC it is the exported graph before any pass, so fusion and precision changes
  are part of what is checked; for an ARTIFACT it is the artifact's own graph.
- The backend runs the artifact through `Backend.observe`, which also returns intermediates by
  IR value name; a backend without it is compared on its outputs only.
- Compiled values are matched to reference values by `correspond` (fused nodes to the values
  they replaced), compared by `metrics.compare` under `thresholds.threshold_for`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.ir import Graph, get_op

from .correspond import correspond
from .layers import layer_labels
from .metrics import Errors, compare
from .thresholds import MANTISSA, Threshold, narrowest, op_class, threshold_for

# (inputs) -> (outputs, {IR value name: array})
Runner = Callable[[Sequence[np.ndarray]], tuple[list[Any], dict[str, Any]]]


@dataclass(frozen=True)
class Check:
    """One compared value, in compiled execution order."""

    name: str
    ref_name: str
    rule: str
    op: str
    op_class: str
    dtype: str
    precision: str  # the dtype whose thresholds apply (see thresholds.py)
    shape: tuple[int, ...]
    loc: str | None
    layer: str
    origin: tuple[str, ...]
    errors: Errors
    threshold: Threshold
    ok: bool

    def to_json(self) -> dict[str, Any]:
        e = self.errors
        return {"value": self.name, "reference": self.ref_name, "matched_by": self.rule,
                "op": self.op, "class": self.op_class, "dtype": self.dtype,
                "precision": self.precision,
                "shape": list(self.shape), "loc": self.loc, "layer": self.layer,
                "origin": list(self.origin), "max_abs": _num(e.max_abs),
                "max_rel": _num(e.max_rel), "cosine": _num(e.cosine), "worst": _num(e.worst),
                "mismatched": e.mismatched, "size": e.size,
                "threshold": {"atol": self.threshold.atol, "rtol": self.threshold.rtol,
                              "cosine": self.threshold.cosine}, "ok": self.ok}


@dataclass
class AlignReport:
    backend: str
    reference: str
    inputs: list[tuple[str, str, tuple[int, ...]]]
    checks: list[Check]
    unmatched: list[str] = field(default_factory=list)  # no counterpart (of the same shape)
    unobserved: list[str] = field(default_factory=list)  # matched, but the backend hides them
    outputs_only: bool = False
    eager_max_abs: float | None = None  # reference outputs vs the torch module (SPEC only)
    reference_outputs: list[np.ndarray] = field(default_factory=list, repr=False)
    output_names: list[str] = field(default_factory=list)

    @property
    def first_failure(self) -> Check | None:
        return next((c for c in self.checks if not c.ok), None)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    @property
    def ok(self) -> bool:
        return self.first_failure is None

    def to_json(self) -> dict[str, Any]:
        first = self.first_failure
        return {"backend": self.backend, "reference": self.reference,
                "inputs": [{"name": n, "dtype": d, "shape": list(s)} for n, d, s in self.inputs],
                "ok": self.ok, "compared": len(self.checks), "failed": len(self.failures),
                "first_failure": first.to_json() if first else None,
                "outputs_only": self.outputs_only, "unmatched": self.unmatched,
                "unobserved": self.unobserved,
                "reference_vs_eager_max_abs": _num(self.eager_max_abs),
                "values": [c.to_json() for c in self.checks]}


def _num(x: float | None) -> float | str | None:
    """JSON has no inf/nan: those become strings."""
    if x is None or np.isfinite(x):
        return x
    return str(x)


def run_reference(graph: Graph, weights: Mapping[str, Any],
                  inputs: Sequence[Any]) -> dict[int, np.ndarray]:
    """Every value the reference interpreter computes (and its inputs and weights), by id."""
    from backends.reference.interpreter import bind_inputs, run_node

    env, bindings = bind_inputs(graph, weights, list(inputs))
    values = {id(v): _to_numpy(env[id(v)]) for v in [*graph.inputs, *graph.weights.values()]}
    for node in graph.nodes:
        for value, tensor in zip(node.outputs, run_node(node, env, bindings)):
            env[id(value)] = tensor
            values[id(value)] = _to_numpy(tensor)
    return values


def _to_numpy(x: Any) -> np.ndarray:
    """numpy, with dtypes numpy lacks (bfloat16, float8) widened to float32 (exact)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        try:
            return x.numpy()
        except TypeError:
            return x.float().numpy()
    return np.asarray(x)


def align_graphs(compiled: Graph, reference: Graph, reference_weights: Mapping[str, Any],
                 run: Runner, inputs: Sequence[np.ndarray], *, backend: str, reference_label: str,
                 atol: float | None = None, rtol: float | None = None,
                 outputs_only: bool = False) -> AlignReport:
    """Compare every matched value of `compiled` (as `run` computes it) with `reference`."""
    ref_values = run_reference(reference, reference_weights, inputs)
    outputs, observed = run(inputs)
    got = {name: _to_numpy(x) for name, x in observed.items()}
    got.update((v.name, _to_numpy(x)) for v, x in zip(compiled.outputs, outputs))
    matches = correspond(compiled, reference)
    layers = layer_labels(compiled)
    precisions = value_precisions(compiled)
    report = AlignReport(backend, reference_label,
                         [(v.name, str(np.asarray(x).dtype), tuple(np.shape(x)))
                          for v, x in zip(compiled.inputs, inputs)], [],
                         outputs_only=outputs_only)
    report.reference_outputs = [ref_values[id(v)] for v in reference.outputs]
    report.output_names = [v.name for v in compiled.outputs]
    for node in compiled.nodes:
        for value in node.outputs:
            match = matches.get(id(value))
            if match is None:
                report.unmatched.append(value.name)
            elif value.name not in got:
                report.unobserved.append(value.name)
            else:
                check = _check(node, value, match, got[value.name], ref_values[id(match.ref)],
                               layers[value.name], precisions[id(value)], atol, rtol)
                if check is None:  # a value the passes reshaped: its readers are compared
                    report.unmatched.append(value.name)
                else:
                    report.checks.append(check)
    return report


def value_precisions(graph: Graph) -> dict[int, str]:
    """Value id -> the narrowest float dtype among the value and everything it is computed
    from (its own dtype for integer and bool values)."""
    precision: dict[int, str] = {id(v): v.type.dtype.value
                                 for v in [*graph.inputs, *graph.weights.values()]}
    for node in graph.nodes:
        upstream = [precision[id(v)] for v in node.inputs if v is not None and id(v) in precision]
        for value in node.outputs:
            own = value.type.dtype.value
            precision[id(value)] = narrowest([own, *upstream]) if own in MANTISSA else own
    return precision


def _check(node, value, match, got: np.ndarray, ref: np.ndarray, layer: str, precision: str,
           atol: float | None, rtol: float | None) -> Check | None:
    if got.shape != ref.shape:
        return None
    kind = get_op(node.op).kind
    threshold = threshold_for(node.op, kind, precision, atol, rtol)
    errors = compare(got, ref, threshold)
    return Check(value.name, match.ref.name, match.rule, node.op, op_class(node.op, kind),
                 value.type.dtype.value, precision, tuple(got.shape), node.loc, layer,
                 tuple(node.attrs.get("origin", ())), errors, threshold,
                 errors.passes(threshold))
