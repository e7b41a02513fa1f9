"""Walks the exported FX graph and converts each node through the ATen table.

Per node: size arithmetic (sym_size, operator.mul, ...) becomes a sympy expression in the
environment, never an IR node; getitem picks a result of a multi-result node; every ATen overload
goes through its converter, whose result types are then checked against what torch recorded in
`meta['val']`. Nodes the IR cannot express are collected, not raised one by one, so the user sees
every missing op at once: a missing node's result is stood in for by a value of torch's type, so
the nodes after it are still converted (into a graph that is then discarded) and checked too.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import Node as FxNode

from compiler.errors import DayzeroError
from compiler.ir import Graph, TensorType, Value
from compiler.ir.ops import ShapeError
from compiler.ir.symbolic import equal, evaluate

from .aten import CONVERTERS
from .aten.complex_numbers import COMPLEX, Complex, is_complex, real_view
from .decompositions import SIZE_OPS
from .emitter import AtenEmitter, Unsupported, ir_dtype
from .locations import Location, node_location
from .symbols import SymbolMap, UnsupportedSymbol

_SYM_INT_TYPES = (torch.SymInt,)

MISSING = object()  # a value nothing can stand in for (see `placeholder_for`)


class ConversionError(RuntimeError):
    """An internal frontend bug: a converter produced a type torch disagrees with."""


class UnsupportedOpsError(DayzeroError):
    """The model uses ops the IR lacks; `ops` maps each (with its reason) to its node count."""

    def __init__(self, what: str, where: str, fix: str, ops: dict[str, int]):
        super().__init__(what, where, fix)
        self.ops = ops


@dataclass
class _Missing:
    """One cause of failure: how many nodes it stopped, the first one's line, and the ops it
    stopped (one op for a missing converter; many for a data-dependent size they all need)."""
    count: int
    first: Location
    ops: list[str] = field(default_factory=list)
    occurrences: int = 0  # nodes of the op that makes the problem (one per layer of a loop)

    def add(self, op: str) -> None:
        self.count += 1
        if op not in self.ops:
            self.ops.append(op)
        self.occurrences += op == self.ops[0]

    def where(self) -> str:
        """`first at file:line (code)`, with how often the problem occurs when more than once."""
        times = f"{self.occurrences} times, " if self.occurrences > 1 else ""
        return f"{times}first at {self.first.describe()}"


def op_name(target: Any) -> str:
    """'aten.add.Tensor' for ATen overloads, 'operator.mul' or the op's name for the rest."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order.{target.name()}"
    module = getattr(target, "__module__", None) or "_operator"
    name = getattr(target, "__name__", None) or str(target)
    return f"{module.lstrip('_')}.{name}"


def bind_arguments(target: torch._ops.OpOverload, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by schema name, with the schema's defaults filled in."""
    bound: dict[str, Any] = {}
    for i, arg in enumerate(target._schema.arguments):
        if i < len(args) and not arg.kwarg_only:
            bound[arg.name] = args[i]
        elif arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
        else:
            bound[arg.name] = None
    return bound


class FxConverter:
    """Converts call_function nodes into `graph`; placeholders are seeded in `env` beforehand."""

    def __init__(self, graph: Graph, symbols: SymbolMap, fallback: Location):
        self.graph = graph
        self.symbols = symbols
        self.emitter = AtenEmitter(graph, symbols)
        self.env: dict[FxNode, Any] = {}
        self.missing: dict[str, _Missing] = {}
        self.errors: dict[str, _Missing] = {}  # converters that failed: dayzero's own bugs
        # unbacked size symbol -> the reported cause (and its table) whose result it sizes
        self.size_causes: dict[str, tuple[str, dict[str, _Missing]]] = {}
        # (op, source line) -> the cause reported there first: a loop over layers runs one line
        # many times, and each run is another occurrence of the same problem, not a new one
        self.sites: dict[tuple[str, Location], tuple[str, dict[str, _Missing]]] = {}
        self.last_loc = fallback

    # -- driving --------------------------------------------------------------------------------
    def run(self, nodes) -> None:
        for node in nodes:
            if node.op == "call_function":
                self.env[node] = self.call(node)
            elif node.op == "get_attr":
                self.env[node] = MISSING  # submodules of control-flow ops; those are reported

    def location(self, node: FxNode) -> Location:
        loc = node_location(node)
        if loc is not None:
            self.last_loc = loc
        return loc or self.last_loc

    def report(self, node: FxNode, what: str, op: str | None = None,
               into: dict[str, _Missing] | None = None) -> Any:
        """Record an unsupported node under its cause `what` (in `missing`, or `into`); stand in
        for its result so later nodes still get checked."""
        table = self.missing if into is None else into
        op, loc = op or what, self.location(node)
        known = self.sites.setdefault((op, loc), (what, table))
        if known[1] is table:  # the same op at the same line: counted under its first reason
            what = known[0]
        entry = table.setdefault(what, _Missing(0, loc))
        entry.add(op)
        for sym in _unbacked_symbols(node.meta.get("val")):  # sizes only this node could give
            self.size_causes.setdefault(sym, (what, table))
        return self.placeholder_for(node.meta.get("val"))

    def report_unsupported(self, node: FxNode, name: str, exc: Exception) -> Any:
        """A data-dependent size is one cause however many ops need it (one entry per symbol);
        any other reason is reported with its op."""
        symbol = getattr(exc, "symbol", None)
        if symbol in self.size_causes:  # made by an op already reported: the same problem
            what, table = self.size_causes[symbol]
            return self.report(node, what, name, into=table)
        if symbol is not None:
            return self.report(node, f"data-dependent size {symbol} (unbacked)", name)
        return self.report(node, f"{name} ({exc})", name)

    def placeholder_for(self, val: Any) -> Any:
        """Values typed like torch's result but produced by no node: the graph is discarded
        (an error follows), yet converters downstream can still report what they lack."""
        if isinstance(val, (tuple, list)):
            return tuple(self.placeholder_for(v) for v in val)
        if not isinstance(val, torch.Tensor):
            return MISSING
        val = real_view(val)
        try:
            return Value(f"missing{len(self.missing)}", TensorType(
                ir_dtype(val.dtype), tuple(self.symbols.expr(d) for d in val.shape)))
        except (Unsupported, UnsupportedSymbol):
            return MISSING

    # -- one node -------------------------------------------------------------------------------
    def call(self, node: FxNode) -> Any:
        name = op_name(node.target)
        if node.target is operator.getitem:
            return self.getitem(node)
        if name in SIZE_OPS or not isinstance(node.target, torch._ops.OpOverload):
            if _is_scalar(node.meta.get("val")):
                return self.size_expression(node, name)
        on_complex = _on_complex(node)
        converter = (COMPLEX if on_complex else CONVERTERS).get(name)
        if converter is None:
            return self.report(node, f"{name} on complex tensors" if on_complex else name, name)
        args = self.lookup((node.args, node.kwargs), on_complex)
        if _contains_missing(args):
            return self.blocked(node, name)
        return self.convert(node, name, converter, bind_arguments(node.target, *args))

    def blocked(self, node: FxNode, name: str) -> Any:
        """A node stopped by a problem upstream is not converted. Where the same op at the same
        line was reported already (the next layer of a loop), it is one more occurrence of that
        problem, and the data-dependent sizes it makes are that problem's too: otherwise every
        later layer's size would be reported as a problem of its own."""
        known = self.sites.get((name, self.location(node)))
        if known is None:
            return MISSING
        return self.report(node, known[0], name, into=known[1])

    def lookup(self, arg: Any, mark_complex: bool = False) -> Any:
        """The converted values of a node's arguments; with `mark_complex`, complex ones
        wrapped in `Complex` (their IR values alone do not say so)."""
        if isinstance(arg, FxNode):
            value = self.env.get(arg, MISSING)
            if mark_complex and value is not MISSING and is_complex(arg.meta.get("val")):
                return Complex(value)
            return value
        if isinstance(arg, (list, tuple)):
            return type(arg)(self.lookup(a, mark_complex) for a in arg)
        if isinstance(arg, dict):
            return {k: self.lookup(v, mark_complex) for k, v in arg.items()}
        return arg

    def size_expression(self, node: FxNode, name: str) -> Any:
        try:
            return self.symbols.expr(node.meta["val"])
        except UnsupportedSymbol as exc:
            return self.report_unsupported(node, name, exc)

    def getitem(self, node: FxNode) -> Any:
        source, index = node.args
        value = self.env.get(source, MISSING)
        if value is MISSING:
            return MISSING
        picked = value[index]
        if picked is None:  # a result the converter has no IR value for (e.g. pooling indices)
            return self.report(node, f"{op_name(source.target)} result {index}")
        return picked

    def convert(self, node: FxNode, name: str, converter: Callable, args: dict) -> Any:
        loc = self.location(node)
        self.emitter.begin(node.name, str(loc), real_view(node.meta.get("val")))
        try:
            result = converter(self.emitter, args)
            self.emitter.finish(result)
            self.check(node, result)
        except (Unsupported, UnsupportedSymbol) as exc:
            self.emitter.abandon()
            return self.report_unsupported(node, name, exc)
        except (ConversionError, ShapeError, TypeError, ValueError, KeyError, IndexError) as exc:
            self.emitter.abandon()
            # a converter bug: collected like a missing op, in rows like a missing op's, so that
            # every problem of the model is listed at once (and coverage still prints its table)
            reason = str(exc) if isinstance(exc, ConversionError) else \
                f"{type(exc).__name__}: {exc}"
            return self.report(node, f"{name} (converter error: {reason})", name,
                               into=self.errors)
        return result

    # -- cross-check against torch ----------------------------------------------------------------
    def check(self, node: FxNode, result: Any) -> None:
        val = real_view(node.meta.get("val"))
        if result is None or val is None:
            return
        pairs = zip(result, val) if isinstance(result, (tuple, list)) else [(result, val)]
        for value, expected in pairs:
            if not isinstance(value, Value) or not isinstance(expected, torch.Tensor):
                continue
            want = TensorType(ir_dtype(expected.dtype),
                              tuple(self.symbols.expr(d) for d in expected.shape))
            if not self.same_type(value.type, want):
                raise ConversionError(f"IR value %{value.name} has type {value.type} but torch "
                                      f"computed {want}")

    def same_type(self, got: TensorType, want: TensorType) -> bool:
        if got.dtype != want.dtype or got.rank != want.rank:
            return False
        return all(self.same_dim(a, b) for a, b in zip(got.shape, want.shape))

    def same_dim(self, a, b) -> bool:
        """Provably equal, or equal at every sample size when sympy cannot simplify."""
        if equal(a, b):
            return True
        samples = [{n: _sample(lo, hi, k) for n, (lo, hi) in self.graph.symbols.items()}
                   for k in range(4)]
        try:
            return all(evaluate(a, s) == evaluate(b, s) for s in samples)
        except (KeyError, TypeError, ValueError):
            return False


def _sample(lo: int, hi: int | None, k: int) -> int:
    top = hi if hi is not None else max(lo, 2) * 64
    return [lo, min(lo + 1, top), (lo + top) // 2, top][k]


def _unbacked_symbols(val: Any) -> list[str]:
    """Names of the data-dependent size symbols in the sizes of a node's result(s)."""
    if isinstance(val, (tuple, list)):
        return [s for v in val for s in _unbacked_symbols(v)]
    dims = val.shape if isinstance(val, torch.Tensor) else [val] if _is_scalar(val) else []
    names = []
    for d in dims:
        if isinstance(d, _SYM_INT_TYPES):
            names += [s.name for s in d.node.expr.free_symbols if s.name.startswith("u")]
    return names


def _on_complex(node: FxNode) -> bool:
    """Whether a node takes or makes complex tensors (converted by the COMPLEX table)."""
    if is_complex(node.meta.get("val")) or any(is_complex(v) for v in _vals(node.meta.get("val"))):
        return True
    return any(is_complex(n.meta.get("val")) for n in node.all_input_nodes)


def _vals(val: Any) -> list:
    return list(val) if isinstance(val, (tuple, list)) else []


def _is_scalar(val: Any) -> bool:
    return isinstance(val, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool))


def _contains_missing(arg: Any) -> bool:
    if arg is MISSING:
        return True
    if isinstance(arg, (list, tuple)):
        return any(_contains_missing(a) for a in arg)
    if isinstance(arg, dict):
        return any(_contains_missing(a) for a in arg.values())
    return False


def _affected(m: _Missing, name: str) -> str:
    others = [op for op in m.ops if op not in name]
    if not others:
        return ""
    shown = ", ".join(others[:3]) + (f" +{len(others) - 3} more" if len(others) > 3 else "")
    return f" (needed by {shown})"


def _rows(table: dict[str, _Missing]) -> list[str]:
    """One line per cause: its name, the nodes it stopped, where it occurs first, what needs it."""
    width = max(len(name) for name in table)
    return [f"  {name:<{width}}  x{m.count:<3} {m.where()}{_affected(m, name)}"
            for name, m in table.items()]


def conversion_error(errors: dict[str, _Missing],
                     missing: dict[str, _Missing]) -> ConversionError:
    """Every converter that failed (an internal error: a bug in dayzero), in the rows of the
    unsupported-op report, with the ops that are merely missing listed after them."""
    total = sum(m.count for m in errors.values())
    lines = [f"{len(errors)} converter failure(s) on {total} node(s): an internal error, a bug "
             "in dayzero (please report it with the model)", *_rows(errors)]
    if missing:
        lines += ["also missing (ops with no dayzero IR equivalent, or sizes the IR cannot hold):",
                  *_rows(missing)]
    return ConversionError("\n".join(lines))


def unsupported_error(missing: dict[str, _Missing], model_name: str) -> UnsupportedOpsError:
    """One error listing every cause of failure (an op the IR lacks, a data-dependent size),
    with node counts and first source lines."""
    lines = _rows(missing)
    total = sum(m.count for m in missing.values())
    return UnsupportedOpsError(
        f"{len(missing)} problem(s) stop the conversion of {total} node(s): ops with no dayzero IR "
        "equivalent, or sizes the IR cannot hold:\n"
        + "\n".join(lines),
        where=f"model {model_name}",
        fix="add a converter for each op in compiler/frontend/aten/ (and an IR op in "
            "compiler/ir/ops/ if the op set lacks one, see docs/ops.md), or register a torch "
            "decomposition for it so it lowers to supported ops; rewriting the model line "
            "shown avoids it too",
        ops={name: m.count for name, m in missing.items()})
