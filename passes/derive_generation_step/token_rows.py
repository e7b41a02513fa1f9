"""token_rows: prove that a graph computes each token's row from that token's rows alone.

A KV-cached generation step runs a forward on a few tokens (the step's) instead of the whole
sequence. That is exact only where every op maps row t of its token-axis operands to row t of
its result: then the step's tokens get what the whole forward gives them, and the only ops that
read other tokens are the paged attentions, which read them from the cache. This module is that
proof, a forward dataflow over the graph (compiler/ir/dataflow.py) with one fact per value:

- `None`: the value does not depend on the tokens and its shape does not mention the token
  symbol (a weight, a table of constants);
- an int `a`: the value's axis `a` is the token axis (its size is the token symbol, which
  appears nowhere else in its shape), and its row t depends only on row t of the token-axis
  values it is computed from;
- `Mixed(node, why)`: `node` (the first such node on the way) combines several tokens' rows, or
  reads the sequence length as a number; every value computed from it is mixed too.

Each op has a transfer rule saying when its result is row-wise (elementwise ops always; a
reduction, a softmax, a concat, a slice, a normalization when it works along another axis; a
linear when the token axis is not the contracted one; paged attention, whose cache reads are
the step's sanctioned mixing). An op without a rule mixes whatever token rows it reads, so a new
op is refused until someone states how it treats tokens: the proof never guesses.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import sympy

from compiler.ir.dataflow import LazyForward
from compiler.ir.graph import Node, Value
from compiler.ir.ops.registry import META_ATTRS, get_op
from compiler.ir.symbolic import equal


@dataclass(frozen=True)
class Mixed:
    """Why a value is not row-wise: the first node that combined tokens (None: a graph
    input), and how."""

    node: Node | None
    why: str


Fact = "int | None | Mixed"
# a rule sees the node, its operands' facts (None for token-free ones) and the token symbol;
# it returns None when the node's result is row-wise, else why not
Rule = Callable[[Node, list, sympy.Symbol], "str | None"]


class TokenRows:
    """The token-row facts of one graph's values, computed on demand (each node once)."""

    def __init__(self, tokens: sympy.Symbol):
        self.tokens = tokens
        self.facts = LazyForward(self._transfer, self._source)

    def of(self, value: Value):
        return self.facts.of(value)

    def _source(self, value: Value):
        """A graph input or weight: its token axis by its shape (an input with a [.., S, ..]
        axis holds one row per token, as `input_ids` and `positions` do)."""
        axis = token_axis(value.shape, self.tokens)
        if axis is _SEVERAL:
            return Mixed(None, f"input %{value.name} {value.type} has the token count in more "
                               "than one place")
        return axis

    def _transfer(self, node: Node, args: list) -> list:
        mixed = next((a for a in args if isinstance(a, Mixed)), None)
        if mixed is not None:
            return [mixed] * len(node.outputs)
        why = _attrs_read_tokens(node, self.tokens)
        if why is None and any(isinstance(a, int) for a in args):
            rule = _RULES.get(node.op) or _KIND_RULES.get(get_op(node.op).kind)
            why = rule(node, args, self.tokens) if rule is not None else \
                f"{node.op} is not known to treat tokens independently"
        if why is not None:
            return [Mixed(node, why)] * len(node.outputs)
        facts = [token_axis(out.shape, self.tokens) for out in node.outputs]
        if any(isinstance(a, int) for a in args) and all(f is None for f in facts):
            return [Mixed(node, "it reduces over the tokens")] * len(node.outputs)
        return [Mixed(node, f"its result {out.type} has the token count in more than one "
                            "place (a token-by-token table?)") if f is _SEVERAL else f
                for f, out in zip(facts, node.outputs)]


class _Several:
    """The token symbol appears more than once in a shape, or inside an expression."""


_SEVERAL = _Several()


def token_axis(shape, tokens: sympy.Symbol):
    """The axis whose size is `tokens`; None when the shape does not mention it; _SEVERAL when
    it appears elsewhere too (twice, or in a product such as 4 * S)."""
    hits = [i for i, d in enumerate(shape) if isinstance(d, sympy.Basic)
            and tokens in d.free_symbols]
    if not hits:
        return None
    return hits[0] if len(hits) == 1 and shape[hits[0]] == tokens else _SEVERAL


def _mentions(x, tokens) -> bool:
    if isinstance(x, sympy.Basic):
        return tokens in x.free_symbols
    if isinstance(x, (list, tuple)):
        return any(_mentions(y, tokens) for y in x)
    return False


# attributes that may name the token count as a size (checked by the op's rule where it matters)
_SIZE_ATTRS = frozenset({"shape", "end"})


def _attrs_read_tokens(node: Node, tokens) -> str | None:
    for name, value in node.attrs.items():
        if name in META_ATTRS or not _mentions(value, tokens):
            continue
        if name in _SIZE_ATTRS and node.op in ("reshape", "expand", "full", "slice"):
            continue
        return f"it reads the sequence length as a number ({name}={value})"
    return None


# -- rules ----------------------------------------------------------------------------------------
def _row_wise(node, args, tokens) -> str | None:
    """Elementwise and broadcasting ops: the shapes line the token axes up."""
    return None


def _dim(node: Node, name: str = "dim", index: int = 0) -> int | None:
    dim = node.attrs.get(name)
    rank = node.inputs[index].type.rank
    return None if dim is None else dim % max(rank, 1)


def _along_other_axis(node, args, tokens) -> str | None:
    """softmax, cumsum, sort, topk, concat, select, flip...: work along `dim` only."""
    axis = next(a for a in args if isinstance(a, int))
    if any(isinstance(a, int) and a != axis for a in args):
        return "its operands hold the tokens on different axes"
    dim = _dim(node)
    if dim is None or dim == axis:
        return f"it works along the token axis (dim {node.attrs.get('dim')})"
    return None


def _slice(node, args, tokens) -> str | None:
    axis, attrs = args[0], node.attrs
    if axis is None or _dim(node) != axis:
        return None
    whole = attrs["start"] == 0 and attrs["step"] == 1 and node.outputs[0].shape[axis] == tokens
    return None if whole else "it slices the token axis"


def _reduce(node, args, tokens) -> str | None:
    axis, dims = args[0], node.attrs.get("dims")
    rank = node.inputs[0].type.rank
    if not dims or axis in [d % rank for d in dims]:
        return "it reduces over the token axis"
    return None


def _arg_reduce(node, args, tokens) -> str | None:
    dim = _dim(node)
    return "it reduces over the token axis" if dim is None or dim == args[0] else None


def _normalized(node, args, tokens) -> str | None:
    """layer_norm / rms_norm and their add_ forms normalize the last dims."""
    axis, rank = next(a for a in args if isinstance(a, int)), node.inputs[0].type.rank
    if any(isinstance(a, int) and a != axis for a in args[:2]):
        return "its operands hold the tokens on different axes"
    if axis >= rank - len(node.attrs["normalized_shape"]) or any(
            isinstance(a, int) for a in args[2:]):
        return "it normalizes over the token axis"
    return None


def _linear(node, args, tokens) -> str | None:
    """linear-like ops: x's rows by token-free weights, the last axis contracted."""
    if any(isinstance(a, int) for a in args[1:]):
        return "its weights depend on the tokens"
    if args[0] is None or args[0] == node.inputs[0].type.rank - 1:
        return "it contracts the token axis"
    return None


def _moe(node, args, tokens) -> str | None:
    """moe: each token routed by its own logits row."""
    x, logits = args[0], args[1]
    if x is None or x == node.inputs[0].type.rank - 1 or logits != x \
            or any(isinstance(a, int) for a in args[2:]):
        return "its tokens are not routed by their own rows"
    return None


def _matmul(node, args, tokens) -> str | None:
    """a @ b: token rows of a by a token-free b, or both batched over the token axis."""
    a, b = args[:2]
    ra, rb = node.inputs[0].type.rank, node.inputs[1].type.rank
    if b is not None and b >= rb - 2:
        return "it multiplies by a matrix over the tokens (an attention score?)"
    if a is not None and (a == ra - 1 or (b is not None and a >= ra - 2)):
        return "it contracts the token axis (an attention score?)"
    return None


def _reshape(node, args, tokens) -> str | None:
    """A reshape keeps rows apart when as many elements precede the token axis before and
    after it."""
    axis, src, out = args[0], node.inputs[0].shape, node.outputs[0].shape
    b = token_axis(out, tokens)
    if not isinstance(b, int) or not equal(math.prod(src[:axis]), math.prod(out[:b])):
        return "it moves elements across the token axis"
    return None


def _pad(node, args, tokens) -> str | None:
    axis, pads, rank = args[0], node.attrs["pads"], node.inputs[0].type.rank
    pair = rank - 1 - axis
    if len(pads) >= 2 * pair + 2 and (pads[2 * pair], pads[2 * pair + 1]) != (0, 0):
        return "it pads the token axis"
    return None


def _repeat(node, args, tokens) -> str | None:
    repeats, rank = node.attrs["repeats"], node.inputs[0].type.rank
    return None if repeats[len(repeats) - rank + args[0]] == 1 else "it repeats the tokens"


def _flip(node, args, tokens) -> str | None:
    rank = node.inputs[0].type.rank
    return "it reverses the tokens" if args[0] in [d % rank for d in node.attrs["dims"]] \
        else None


def _triangle(node, args, tokens) -> str | None:
    rank = node.inputs[0].type.rank
    return "it masks the token axis by position" if args[0] >= rank - 2 else None


def _embedding(node, args, tokens) -> str | None:
    return "its table depends on the tokens" if args[0] is not None else None


def _index_select(node, args, tokens) -> str | None:
    x, index = args[:2]
    if x is not None and index is not None:
        return "it picks token rows by token-dependent indices"
    if x is not None and _dim(node) == x:
        return "it picks rows along the token axis"
    return None


def _gather(node, args, tokens) -> str | None:
    x, index = args[:2]
    if x is not None and (index != x or _dim(node) == x):
        return "it gathers along the token axis"
    return None


def _paged(node, args, tokens) -> str | None:
    """Paged attention: the step's one sanctioned reader of other tokens, through the cache."""
    return None


def _refuse(why: str) -> Rule:
    return lambda node, args, tokens: why


_KIND_RULES: dict[str, Rule] = {
    "elementwise": _row_wise,
    "reduction": _reduce,
    "normalization": _refuse("it normalizes across tokens"),
    "attention": _refuse("it attends over the whole sequence, and was not paged"),
}

_RULES: dict[str, Rule] = {
    **dict.fromkeys(("rotary_embedding", "quick_gelu", "expand", "permute", "batch_norm"),
                    _row_wise),
    **dict.fromkeys(("softmax", "log_softmax", "cumsum", "sort", "topk", "concat", "select"),
                    _along_other_axis),
    **dict.fromkeys(("argmax", "argmin"), _arg_reduce),
    **dict.fromkeys(("layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"), _normalized),
    **dict.fromkeys(("linear", "fused_linear", "quantized_linear", "gated_mlp"), _linear),
    **dict.fromkeys(("moe", "quantized_moe"), _moe),
    **dict.fromkeys(("paged_attention", "paged_latent_attention"), _paged),
    **dict.fromkeys(("tril", "triu"), _triangle),
    "matmul": _matmul, "reshape": _reshape, "slice": _slice, "pad": _pad, "repeat": _repeat,
    "flip": _flip, "embedding": _embedding, "index_select": _index_select, "gather": _gather,
    "histc": _refuse("it counts over the tokens"),
    "multi_head_attention": _refuse("it attends over the whole sequence, and was not paged"),
    "latent_attention": _refuse("it attends over the whole sequence, and was not paged"),
}
