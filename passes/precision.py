"""precision: run a float32 graph's activations in bf16/fp16 and store its weights in bf16/fp16.

The recipe is automatic mixed precision's, decided per node from the op table's kinds:

- matmul-like ops (`matmul`, `convolution`, `attention` kinds, fused linears) compute in
  `activation_dtype`: their float operands, weights included, are cast to it;
- numerically sensitive ops compute in fp32 (`keep_fp32`, categories joined by `+`): `norm`
  (normalization ops), `softmax`, `reduction` (sum, mean, var, prod, cumsum) and `math` (pow,
  exp, log, rsqrt, ... the functions whose fp16 results overflow or lose all precision: a
  decomposed RMSNorm's `pow(x, 2)` overflows fp16 at |x| > 256);
- every other op computes in the widest dtype among its operands that carry data, and casts the
  rest (position tables, masks, scalars) to it, as Hugging Face's `cos.to(x.dtype)` does;
- `embedding` gathers rows of the table as stored and casts the rows to `activation_dtype`.

"Carrying data" is what separates activations from position math: a value is data if it depends
on a float graph input or on a row gathered from a float weight (an embedding). Values computed
only from integer inputs, `arange` and buffers (rotary angles, causal masks) stay in fp32, which
is what models ask for with `autocast(enabled=False)`; in bf16, rotary angles of positions in
the thousands would be off by whole radians.

Weights: a float32 weight used where something computes below fp32 is stored in `weight_dtype`
(its data converted: lazily, chunk by chunk, for a checkpoint's lazy handles; with an overflow
check that names the weight), and cast where a use needs another dtype. If every use wants one
dtype narrower than `weight_dtype`, the weight is stored in that dtype directly (a cast of a
constant would be folded anyway, and folding would hold every weight in memory at once).
Weights only fp32 code reads (norm scales, `inv_freq`) stay fp32.

Needs: a graph computing in float32 (values of other float dtypes are the model's explicit
choice and are left alone). Guarantees: the same graph interface (float outputs are cast back to
their dtype unless `cast_outputs=false`); a cast node wherever two dtypes meet.
Why: bf16/fp16 halve weight memory and bandwidth, which is most of an LLM's cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from compiler.errors import DayzeroError
from compiler.ir import DType, Graph, Node, Value, get_op
from compiler.ir.weights import convert_weight

from .base import Pass, PassResult
from .registry import register_pass

_DTYPES = {"fp32": DType.f32, "bf16": DType.bf16, "fp16": DType.f16}
_Precision = Literal["fp32", "bf16", "fp16"]

LOW_KINDS = frozenset({"matmul", "convolution", "attention"})
LOW_OPS = frozenset({"fused_linear", "gated_mlp"})
GATHER_KINDS = frozenset({"indexing"})
KEEP_CATEGORIES: dict[str, frozenset[str]] = {
    "norm": frozenset({"layer_norm", "rms_norm", "group_norm", "batch_norm", "add_rms_norm",
                       "add_layer_norm"}),
    "softmax": frozenset({"softmax", "log_softmax"}),
    "reduction": frozenset({"sum", "mean", "var", "prod", "cumsum"}),
    "math": frozenset({"pow", "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "rsqrt",
                       "sqrt", "reciprocal", "erfinv", "tan", "sinh", "cosh", "acos", "asin"}),
}
F32 = DType.f32


@register_pass
@dataclass(frozen=True)
class Precision(Pass):
    """Mixed precision for a float32 graph; see the module docstring for the rules.

    Needs: a valid graph computing in f32. Guarantees: matmul-like ops in `activation_dtype`,
    `keep_fp32` categories in f32, data-free position math untouched, weights stored in
    `weight_dtype` where low-precision code reads them, explicit casts where dtypes meet, the
    graph's output dtypes unchanged (with `cast_outputs`). Why: halves weight memory and
    bandwidth while keeping what overflows or drifts in fp32.
    """

    name: ClassVar[str] = "precision"
    summary: ClassVar[str] = "run activations in bf16/fp16, keep norms/softmax/reductions in fp32"

    weight_dtype: _Precision = "fp32"
    activation_dtype: _Precision = "fp32"
    keep_fp32: str = "norm+softmax+reduction+math"
    cast_outputs: bool = True

    def __post_init__(self):
        unknown = set(self.keep_fp32.split("+")) - set(KEEP_CATEGORIES) - {"none"}
        if unknown:
            raise DayzeroError(f"option 'keep_fp32' of pass 'precision' has unknown categories "
                               f"{sorted(unknown)}", None, "join categories from "
                               f"{sorted(KEEP_CATEGORIES)} with '+', or write none")

    def kept_ops(self) -> frozenset[str]:
        parts = [p for p in self.keep_fp32.split("+") if p != "none"]
        return frozenset().union(*(KEEP_CATEGORIES[p] for p in parts))

    def run(self, graph: Graph) -> PassResult:
        weight, act = _DTYPES[self.weight_dtype], _DTYPES[self.activation_dtype]
        if weight == F32 and act == F32:
            return PassResult(graph, False)
        plan = _PrecisionPlanner(graph, act, weight, self.kept_ops()).plan()
        changed = _Rewriter(graph, plan, self.cast_outputs).apply()
        return PassResult(graph, changed)


@dataclass
class _Plan:
    wants: dict[int, list[DType | None]] = field(default_factory=dict)  # id(node) -> per input
    post_cast: dict[int, DType] = field(default_factory=dict)  # id(node) -> dtype of its output
    storage: dict[str, DType] = field(default_factory=dict)  # weight name -> new dtype
    original: dict[int, DType] = field(default_factory=dict)  # id(value) -> dtype before


class _PrecisionPlanner:
    """Decides, without touching the graph, the dtype each node reads each operand in."""

    def __init__(self, graph: Graph, act: DType, weight: DType, kept: frozenset[str]):
        self.graph, self.act, self.weight, self.kept = graph, act, weight, kept
        self.cur: dict[int, DType] = {id(v): v.type.dtype for v in graph.values()}
        self.data: set[int] = {id(v) for v in graph.inputs if v.type.dtype.is_float}
        # weight name -> {(dtype a use reads it in, whether that use is fp32-only code)}
        self.weight_wants: dict[str, set[tuple[DType, bool]]] = {}
        self.sensitive: set[int] = set()  # ids of nodes that keep fp32 (kept ops, position math)

    def plan(self) -> _Plan:
        plan = _Plan(original=dict(self.cur))
        for node in self.graph.nodes:
            wants = self._node(node, plan)
            plan.wants[id(node)] = wants
            for value, want in zip(node.inputs, wants):
                if value is not None and want is not None and self.graph.is_weight(value):
                    use = (want, id(node) in self.sensitive)
                    self.weight_wants.setdefault(value.name, set()).add(use)
        for name, wants in self.weight_wants.items():
            storage = self._storage(wants)
            if storage != self.graph.weights[name].type.dtype:
                plan.storage[name] = storage
        return plan

    def _node(self, node: Node, plan: _Plan) -> list[DType | None]:
        inputs = node.inputs
        kind = get_op(node.op).kind
        gathers = kind in GATHER_KINDS and self._float_weight(inputs[0])
        is_data = gathers or any(v is not None and id(v) in self.data for v in inputs)
        if not is_data:  # position math: as it was (a shared weight is cast back if stored low)
            self.sensitive.add(id(node))
            wants = [F32 if self._convertible(v) and self.graph.is_weight(v) else None
                     for v in inputs]
            return self._outputs(node, wants, data=False)
        if node.op == "embedding":
            wants = [self.weight if self._convertible(inputs[0]) else None, None]
            wants = self._outputs(node, wants, data=True)
            out = node.outputs[0]
            if plan.original[id(out)] == F32 and self.cur[id(out)] != self.act:
                plan.post_cast[id(node)] = self.act
                self.cur[id(out)] = self.act
            return wants
        if kind in LOW_KINDS or node.op in LOW_OPS:
            target = self.act
        elif node.op in self.kept:
            target = F32
            self.sensitive.add(id(node))
        elif node.op == "cast":
            return self._outputs(node, [None], data=True)
        else:
            carried = {self.cur[id(v)] for v in inputs
                       if v is not None and id(v) in self.data and self._convertible(v)}
            target = _widest(carried) if carried else F32
        wants = [target if self._convertible(v) else None for v in inputs]
        return self._outputs(node, wants, data=True)

    def _outputs(self, node: Node, wants: list[DType | None], data: bool) -> list[DType | None]:
        types = [None if v is None else v.type.with_dtype(w or self.cur[id(v)])
                 for v, w in zip(node.inputs, wants)]
        try:
            outs = get_op(node.op).infer(types, node.attrs)
        except ValueError as exc:
            raise DayzeroError(f"precision: {node.op} cannot take operands "
                               f"{[str(t) for t in types]}: {exc}", node.loc or repr(node),
                               "run the precision pass on a graph that computes in f32, or "
                               "set keep_fp32 to keep this op in fp32") from exc
        for value, out in zip(node.outputs, outs):
            self.cur[id(value)] = out.dtype
            if data:
                self.data.add(id(value))
        return wants

    @staticmethod
    def _convertible(value: Value | None) -> bool:
        """An f32 value of the input graph (the planner never changes the graph's types)."""
        return value is not None and value.type.dtype == F32

    def _float_weight(self, value: Value | None) -> bool:
        return value is not None and self.graph.is_weight(value) and value.type.dtype.is_float

    def _storage(self, uses: set[tuple[DType, bool]]) -> DType:
        """fp32 if only fp32 code reads the weight; else weight_dtype, or the one narrower dtype
        every use reads it in."""
        if all(sensitive for _, sensitive in uses):
            return F32
        wants = {dtype for dtype, _ in uses}
        if len(wants) == 1:
            (only,) = wants
            if only.itemsize < self.weight.itemsize:
                return only
        return self.weight


class _Rewriter:
    """Applies a plan: converts weights, inserts casts, retypes outputs."""

    def __init__(self, graph: Graph, plan: _Plan, cast_outputs: bool):
        self.graph, self.plan, self.cast_outputs = graph, plan, cast_outputs
        self.casts: dict[tuple[int, DType], Value] = {}
        self.alias: dict[int, Value] = {}
        self.changed = False

    def apply(self) -> bool:
        for name, dtype in self.plan.storage.items():
            value = self.graph.weights[name]
            value.type = value.type.with_dtype(dtype)
            if name in self.graph.weight_data:
                self.graph.weight_data[name] = convert_weight(self.graph.weight_data[name],
                                                              dtype, name)
            self.changed = True
        for node in list(self.graph.nodes):
            self._node(node)
        self._outputs()
        return self.changed

    def _node(self, node: Node) -> None:
        inputs = [None if v is None else self.alias.get(id(v), v) for v in node.inputs]
        wants = self.plan.wants[id(node)]
        for i, (v, w) in enumerate(zip(inputs, wants)):
            self.graph.set_input(node, i, self._cast(v, w, node))
        types = [None if v is None else v.type for v in node.inputs]
        for value, out in zip(node.outputs, get_op(node.op).infer(types, node.attrs)):
            if out.dtype != value.type.dtype:
                value.type = out
                self.changed = True
        dtype = self.plan.post_cast.get(id(node))
        if dtype is not None:
            out = node.outputs[0]
            after = self._next(node)
            cast = self.graph.add_node("cast", [out], {"dtype": dtype}, loc=node.loc,
                                       names=[f"{out.name}_{dtype}"], before=after)
            self.alias[id(out)] = cast.output
            self.changed = True

    def _next(self, node: Node) -> Node | None:
        index = self.graph.index(node)
        return self.graph.nodes[index + 1] if index + 1 < len(self.graph.nodes) else None

    def _cast(self, value: Value | None, dtype: DType | None, user: Node) -> Value | None:
        if value is None or dtype is None or value.type.dtype == dtype:
            return value
        key = (id(value), dtype)
        if key not in self.casts:
            node = self.graph.add_node("cast", [value], {"dtype": dtype}, loc=user.loc,
                                       names=[f"{value.name.replace('.', '_')}_{dtype}"],
                                       before=user)
            self.casts[key] = node.output
            self.changed = True
        return self.casts[key]

    def _outputs(self) -> None:
        outputs = []
        for value in self.graph.outputs:
            original = self.plan.original.get(id(value), value.type.dtype)
            value = self.alias.get(id(value), value)
            if self.cast_outputs and value.type.dtype != original:
                cast = self.graph.add_node("cast", [value], {"dtype": original}, loc=None).output
                value.name, cast.name = cast.name, value.name  # the output keeps its name
                value = cast
                self.changed = True
            outputs.append(value)
        self.graph.outputs = outputs


def _widest(dtypes: set[DType]) -> DType:
    return next(iter(dtypes)) if len(dtypes) == 1 else F32
