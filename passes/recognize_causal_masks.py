"""recognize_causal_masks: prove an in-graph attention mask causal (maybe within a sliding
window), then use is_causal=true (and window=w)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import sympy

from compiler.ir import Graph
from compiler.ir.analysis import mark_changed, register_analysis
from compiler.ir.dataflow import LazyForward
from compiler.ir.dtypes import DType
from compiler.ir.graph import Node, Value
from compiler.ir.symbolic import product

from . import index_expressions as ix
from .base import Pass, PassResult
from .index_expressions import INDEX, Indexed
from .mask_transfers import TRANSFERS, NodeTransfer, same_dim
from .registry import register_pass

_MAX_WEIGHT_ELEMENTS = 1 << 16  # a larger constant is never a mask ingredient worth reading


# -- the prover -----------------------------------------------------------------------------------
class MaskProver:
    """Reads size-only values of one graph as `Indexed` expressions: a forward dataflow over the
    transfer table (`compiler.ir.dataflow.LazyForward`), computed on demand and memoised per
    value, so proving every mask of a graph visits each node of their cones once."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.ranges = graph.symbols
        self.facts = LazyForward(self._step, self._weight)
        # a cheap first question on the same walker: a mask that reads a graph input (a padding
        # mask) is given up without reading its size-only parts as expressions
        self.reads_input = LazyForward(lambda node, args: [any(args)] * len(node.outputs),
                                       lambda v: not graph.is_weight(v))

    def expression(self, value: Value) -> Indexed | None:
        """`value` as an index expression, or None if it depends on a graph input, on a weight
        whose elements differ, or on an op the transfer table does not model."""
        return None if self.reads_input.of(value) else self.facts.of(value)

    def _step(self, node: Node, args: list[Indexed | None]) -> list[Indexed | None]:
        """A node's output expression: unknown when any operand present is (a graph input among
        its ancestors makes every descendant unknown), or when the node has several outputs."""
        if len(node.outputs) != 1 or any(a is None and v is not None
                                         for a, v in zip(args, node.inputs)):
            return [None] * len(node.outputs)
        return [self._transfer(node, args)]

    def _transfer(self, node: Node, args: list[Indexed | None]) -> Indexed | None:
        rule = TRANSFERS.get(node.op)
        result = None if rule is None else rule(NodeTransfer(node, args, self.ranges))
        if result is not None:
            result = ix.simplify(result, self.ranges)
        if result is None or not ix.fits(result, node.outputs[0].dtype, self.ranges):
            return None
        return result

    def _weight(self, value: Value) -> Indexed | None:
        """A constant weight whose elements are all equal is that value; any other is unknown
        (and so is a graph input)."""
        data = self.graph.weight_data.get(value.name) if self.graph.is_weight(value) else None
        size = product(value.shape)
        if data is None or not isinstance(size, int) or not 0 < size <= _MAX_WEIGHT_ELEMENTS:
            return None  # checked before reading: a lazy checkpoint tensor stays on disk
        import torch

        flat = torch.as_tensor(data).reshape(-1)
        if not bool((flat == flat[0]).all()):
            return None
        first = ix.scalar(flat[0].item(), value.dtype)
        return ix.constant(value.shape, ix.kind_of(value.dtype), first)

    def why_not_causal(self, node: Node) -> str | None:
        """None when `node`'s mask provably equals the causal mask, with or without a sliding
        window (see `window`); otherwise the reason."""
        return self.verdict(node).why

    def verdict(self, node: Node) -> MaskVerdict:
        """Whether `node`'s mask is provably `key <= query` (and `key > query - w` for one
        constant w: a sliding window), for a scaled_dot_product_attention or a
        multi_head_attention with a mask operand."""
        site = _Site.of(node)
        mask = node.inputs[site.mask_index]
        m = mask.type
        if not same_dim(site.query_length, site.key_length):
            return MaskVerdict("query and key lengths are not provably equal")
        if m.rank < 2 or m.rank > len(site.lead) + 2 or not (
                same_dim(m.shape[-2], site.query_length)
                and same_dim(m.shape[-1], site.key_length)):
            return MaskVerdict(f"mask shape {list(m.shape)} is not [..., L, L] for this attention")
        lead = len(site.lead) + 2 - m.rank
        if not all(n == 1 or same_dim(n, site.lead[lead + j])
                   for j, n in enumerate(m.shape[:-2])):
            return MaskVerdict(f"mask shape {list(m.shape)} broadcasts beyond the attention's "
                           "batch dims")
        if m.dtype.is_float and m.dtype != node.inputs[0].dtype:
            return MaskVerdict("an additive mask of another dtype than the queries")
        x = self.expression(mask)
        if x is None:
            return MaskVerdict("the mask depends on a graph input or on an op this pass "
                               "cannot read")
        allowed = _allowed_values(x, m.dtype, self.ranges)
        if allowed is None:
            return MaskVerdict("an additive mask whose values are not 0 and -inf (or the dtype's "
                           "minimum)")
        row, col = INDEX[m.rank - 2], INDEX[m.rank - 1]
        if allowed == ix.make_atom("le", col - row):
            return MaskVerdict(None)
        window = _sliding_window(allowed, row, col, ix.Context.of(x.shape, self.ranges))
        if window is not None:
            return MaskVerdict(None, window)
        return MaskVerdict(f"the mask is {allowed} over (query, key) = {row}, {col}, not key <= "
                       "query (nor that within a constant sliding window)")


@dataclass(frozen=True)
class MaskVerdict:
    """`why` the mask is not causal (None: it is), and the sliding `window` it keeps (None:
    none) when it is."""

    why: str | None
    window: int | None = None


@dataclass(frozen=True)
class _Site:
    """Where an attention op keeps its mask, its query and key lengths, and the batch dims a
    mask may broadcast over (the ops lay their operands out differently)."""

    mask_index: int
    query_length: object
    key_length: object
    lead: tuple

    @classmethod
    def of(cls, node: Node) -> _Site:
        q, k = node.inputs[0].type, node.inputs[1].type
        if node.op == "multi_head_attention":  # [b, s, h * d]; the mask [b, h, s, s]
            return cls(5, q.shape[1], k.shape[1], (q.shape[0], node.attrs["num_heads"]))
        return cls(3, q.shape[-2], k.shape[-2], tuple(q.shape[:-2]))


def _sliding_window(allowed, row, col, ctx: ix.Context) -> int | None:
    """w when `allowed` is `key <= query and key > query - w` for a constant w >= 1 (how
    transformers' sliding_window_overlay reads `kv_idx > q_idx - sliding_window`), else None.
    The candidate is rebuilt from w and simplified in the same context, so the comparison is
    structural on canonical atoms: a proof, not a pattern."""
    if not isinstance(allowed, sympy.And):
        return None
    for atom in allowed.args:
        parts = ix.atom_parts(atom) if isinstance(atom, sympy.core.relational.Relational) \
            else None
        split = None if parts is None or parts[0] != "le" else \
            ix.linear_terms(parts[1], frozenset({row, col}))
        if split is None or split[0] != {row: 1, col: -1} or not split[1].is_Integer:
            continue
        window = 1 - int(split[1])  # row - col + c <= 0  <=>  col > row - (1 - c)
        if window < 1:
            continue
        candidate = sympy.And(ix.make_atom("le", col - row),
                              ix.make_atom("le", row - col + 1 - window))
        if ix.simplify_formula(candidate, ctx) == allowed:
            return window
    return None


def _allowed_values(x: Indexed, dtype: DType, ranges):
    """Where attention may look, as a formula: a bool mask's own, or where an additive mask is 0
    (None if an additive mask holds anything but 0 and a blocking value)."""
    if x.kind == "bool":
        return x.formula
    import torch

    blocking = {-sympy.oo, sympy.Float(torch.finfo(dtype.to_torch()).min)}
    if x.kind != "float" or any(v != 0 and v not in blocking for _, v in x.cases):
        return None
    open_ = sympy.Or(*(c for c, v in x.cases if v == 0))
    return ix.simplify_formula(open_, ix.Context.of(x.shape, ranges))


CAUSAL_MASKS = "causal_masks"
ATTENTION_OPS = frozenset({"scaled_dot_product_attention", "multi_head_attention"})


@dataclass(frozen=True)
class MaskProof:
    """Every attention with a mask operand and is_causal=false, with its verdict: why its mask
    is not causal, or the sliding window it keeps when it is."""

    verdicts: dict[Node, MaskVerdict]


def _describe(graph: Graph, proof: MaskProof) -> list[str]:
    def line(verdict: MaskVerdict) -> str:
        if verdict.why is not None:
            return f"not causal: {verdict.why}"
        return "causal" if verdict.window is None else f"causal, window {verdict.window}"
    return [f"%{node.outputs[0].name}: {line(v)}" for node, v in proof.verdicts.items()]


@register_analysis(CAUSAL_MASKS, "which attention masks are provably causal, or why not",
                   _describe)
def prove_masks(graph: Graph) -> MaskProof:
    prover = MaskProver(graph)
    return MaskProof({node: prover.verdict(node) for node in graph.nodes
                      if node.op in ATTENTION_OPS and not node.attrs["is_causal"]
                      and node.inputs[_Site.of(node).mask_index] is not None})


@register_pass
@dataclass(frozen=True)
class RecognizeCausalMasks(Pass):
    """Replace a materialized causal mask on scaled_dot_product_attention or
    multi_head_attention by is_causal=true (and window=w for a sliding window).

    Needs: a valid graph; constant weights' data in `graph.weight_data` when the mask reads them.
    Guarantees: an attention whose mask is computed from sizes alone (arange, comparisons,
    slicing, advanced indexing, ... with no graph input among its ancestors) and provably equals
    `key <= query` for every size in the symbols' ranges, with query and key lengths provably
    equal, loses the mask operand and gets is_causal=true; one that provably equals
    `key <= query and key > query - w` for a constant w also gets window=w. Nothing else
    changes (the mask's nodes die in eliminate_dead_code). A mask that reads a graph input (a
    padding mask) or that the proof cannot settle is left alone: the pass never guesses.
    Why: Hugging Face decoders traced by torch.export build the causal mask as a bool
    [1, 1, S, S] tensor (Mistral's and Gemma 2's with a sliding window); backends then run a
    general masked attention, while with is_causal ONNX Runtime uses its causal kernel and the
    flash kernel skips the upper triangle. It also reads multi_head_attention because eager
    attention (a matmul/softmax chain) only becomes an attention op in fuse: a pipeline runs
    this pass again after fuse to reach those masks.
    """

    name: ClassVar[str] = "recognize_causal_masks"
    summary: ClassVar[str] = "prove size-only attention masks causal (or sliding-window causal) " \
        "and set is_causal=true"

    def run(self, graph: Graph) -> PassResult:
        changed = False
        for node, verdict in graph.analysis(CAUSAL_MASKS).verdicts.items():
            if verdict.why is None:
                graph.set_input(node, _Site.of(node).mask_index, None)
                node.attrs = {**node.attrs, "is_causal": True, "window": verdict.window}
                changed = True
        if changed:  # the attribute edit above bypasses the graph's methods
            mark_changed(graph)
        return PassResult(graph, changed)
