"""Expert parallelism: each `moe` op's experts spread over the ranks of an expert group.

`parallel: {expert_parallel: N}` gives each of N neighbouring ranks E/N of every `moe` op's E
experts: rank p of the group owns experts [p*E/N, (p+1)*E/N) and stores only their stacked
weights (and biases). Three pieces:

- `shard_expert_parallel{size=N}` (shard_expert_parallel.py) seeds `shard(@w)
  {layout="ep:S0"}` on every moe op's stacked expert operands, and refuses an N that does not
  divide an op's expert count (naming the node and `parallel.expert_parallel`), or a graph with
  no `moe` op at all (its MoE blocks were not recognised; expert parallelism would silently do
  nothing).
- the `moe` sharding rule: with its experts split over `ep`, the op takes its tokens and router
  logits whole and gives a whole result (or all three split by data parallelism: an expert
  group lies within one data-parallel replica), so propagation inserts nothing around it.
- `expand_moe`, called by `localize`, writes each rank's part of such an op:

      weights, indices = route(logits)                  every rank routes every token
      rows, ids, sources = expert_dispatch(x, indices)  all-to-all: counts, then the rows
      y = moe(rows, onehot(ids), local experts) {top_k=1, routing="topk_softmax"}
      out = expert_combine(y, sources, weights, indices)  inverse all-to-all, weighted sum,
                                                           all-gather of the token slices

  The local experts run as a `moe` op of their own, so the backend's kernel computes them (on
  onnxruntime com.microsoft.MoE): each received row picks its expert through one-hot logits, and
  a softmax over the single chosen logit is exactly 1, so each row gets exactly its expert's
  output. The routing weights are applied in `expert_combine`, in eager's order.

Why each rank dispatches only its own slice of the tokens. The tokens reaching a moe op are
replicated over the group (attention before it runs replicated or tensor parallel, both of which
end with whole hidden states). If every rank dispatched every token, each (token, expert) pair
would be computed N times; taking disjoint slices, [p*T//N, (p+1)*T//N), computes every pair
exactly once and moves it over the wire once each way, and the all-gather at the end restores
the replicated hidden states the next layer expects. Routing stays on every rank for all tokens
(the router is one small linear and a top-k): both collectives need the same indices, and
cutting them to the slice would need sizes like T//N that the IR's size expressions do not
carry. The alternative without all-to-all (every rank computes its experts' share of all tokens,
then one all-reduce) moves less for replicated tokens, but it is not expert parallelism where
the tokens differ per rank, which is what the all-to-all form grows into.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from compiler.ir import DType, Node, Value, get_op
from compiler.ir.ops.fused import Emitter
from compiler.ir.ops.moe import route
from compiler.ir.ops.registry import META_ATTRS
from compiler.ir.symbolic import upper_bound

from .layout import REPLICATED, Layout, divisible
from .rules import Decision, replicate_all, rule

if TYPE_CHECKING:
    from .localize import _Localizer

AXIS = "ep"
EXPERTS = Layout(((AXIS, 0),))  # stacked expert weights split along the experts
# the moe operands stacked by expert (dim 0), and the ones expert parallelism knows how to place
EXPERT_OPERANDS = ("w_gate_up", "w_down", "b_gate_up", "b_down")
TOKEN_OPERANDS = ("x", "logits")  # [tokens, ...]: whole, or split by data parallelism
PLACED = (*TOKEN_OPERANDS, "score_bias", *EXPERT_OPERANDS)
ROWS_SYMBOL = "ep_rows"  # prefix of the symbols for the rows a rank receives


def operand_names() -> list[str]:
    """The moe op's operand names, in order, from its declaration."""
    return [name.rstrip("?*") for name in get_op("moe").inputs]


@rule("moe")
def moe_rule(node: Node, layouts, sizes) -> Decision:
    """Experts split over `ep` stay split; tokens, logits and the result are whole, or split
    by data parallelism (each data-parallel replica's expert group sees its own tokens)."""
    names = operand_names()
    if AXIS not in sizes or layouts[names.index("w_gate_up")].dim_of(AXIS) != 0:
        return replicate_all(node, layouts, sizes)
    tokens = REPLICATED
    if layouts[0].dim_of("dp") == 0 and divisible(node.inputs[0].type.shape[0], sizes["dp"]):
        tokens = Layout((("dp", 0),))
    want = [None if v is None else EXPERTS if name in EXPERT_OPERANDS else
            tokens if name in TOKEN_OPERANDS else REPLICATED
            for name, v in zip(names, node.inputs)]
    return Decision(want, [tokens])


def expand_moe(loc: _Localizer, node: Node, operands: list[Value | None]) -> Value:
    """This rank's program for a moe op whose experts are split over `ep` (see the module
    docstring); returns the local value of the op's (whole) result."""
    graph, group = loc.out, loc.mesh.group(loc.rank, AXIS)
    ops = dict(zip(operand_names(), operands))
    attrs = get_op("moe").complete_attrs({k: v for k, v in node.attrs.items()
                                          if k not in META_ATTRS})
    x, local_gate_up = ops["x"], ops["w_gate_up"]
    experts = node.inputs[operand_names().index("w_gate_up")].type.shape[0]
    local = local_gate_up.type.shape[0]
    emit = Emitter(graph, loc=node.loc)
    weights, indices = route(emit, ops["logits"], ops.get("score_bias"), attrs)
    tokens = x.type.shape[0]
    rows = f"{ROWS_SYMBOL}{sum(s.startswith(ROWS_SYMBOL) for s in graph.symbols)}"
    graph.symbols[rows] = (0, upper_bound(tokens * attrs["top_k"], graph.symbols))
    name = node.output.name
    dispatch = graph.add_node("expert_dispatch", [x, indices],
                              {"axis": AXIS, "experts": experts, "rows": rows, "ranks": group},
                              loc=node.loc, names=[f"{name}.rows", f"{name}.experts",
                                                   f"{name}.sources"])
    moved, ids, sources = dispatch.outputs
    column = emit.op("reshape", ids, shape=[moved.type.shape[0], 1])
    onehot = emit.op("eq", column, emit.op("arange", start=0, end=local, step=1,
                                           dtype=DType.i64))
    choose = emit.op("cast", onehot, dtype=x.type.dtype)
    expert_out = graph.add_node(
        "moe", [moved, choose, local_gate_up, ops["w_down"], ops.get("b_gate_up"),
                ops.get("b_down"), None],
        {"top_k": 1, "routing": "topk_softmax", "normalize": False, "normalize_eps": 0.0,
         "scale": 1.0, "activation": attrs["activation"]}, loc=node.loc,
        names=[f"{name}.local"]).output
    combine = graph.add_node("expert_combine", [expert_out, sources, weights, indices],
                             {"axis": AXIS, "experts": experts, "ranks": group}, loc=node.loc,
                             names=[name])
    for made in [*emit.created, dispatch, expert_out.producer, combine]:
        loc.local.origin[id(made)] = loc.index
    return combine.output
