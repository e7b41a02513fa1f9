"""scaled_dot_product_attention: the standard-op form, and ORT's fused MultiHeadAttention.

The standard form works for any rank, mask and head layout. MultiHeadAttention (com.microsoft)
runs the whole attention in one kernel without materializing the score tensor per op; it takes
the query as [batch, seq, heads * head_size] and key/value as [batch, heads, seq, head_size], so
the query is transposed in and the output out again (ORT's transpose optimizer cancels these
against the model's own head-splitting transposes where no elementwise op sits between them).
"""

from __future__ import annotations

import math

from compiler.ir import DType, Node
from compiler.ir.symbolic import is_static

from .builder import ONNX_DTYPES, Builder, fill_value
from .convert_elementwise import in_dtype


def mask_terms(b: Builder, node: Node, mask: str | None,
               index: int = 3) -> tuple[str | None, str | None]:
    """The mask as an additive bias, and a 0/1 factor for rows that may attend to anything.

    torch returns zeros for a query row whose mask hides every key (its "safe softmax"); a plain
    softmax over an all -inf row gives NaN. So such rows get a bias of 0 (finite softmax) and
    their output is multiplied by 0. Both terms are mask-sized and built once per mask, however
    many layers share it.
    """
    if mask is None:
        return None, None
    dtype = in_dtype(node)
    kind = node.inputs[index].type.dtype

    def make():
        zero, ninf = b.const(0.0, dtype), b.const(-math.inf, dtype)
        attend = mask if kind == DType.bool else b.op1("Not", [b.op1("Equal", [mask, ninf])])
        valid = b.op1("ReduceMax", [b.op1("Cast", [attend], to=ONNX_DTYPES[dtype]),
                                    b.ints([-1])], keepdims=1)
        hidden_row = b.op1("Not", [b.op1("Cast", [valid], to=ONNX_DTYPES[DType.bool])])
        if kind == DType.bool:
            bias = b.op1("Where", [b.op1("Or", [mask, hidden_row]), zero, ninf])
        else:
            bias = b.op1("Where", [hidden_row, zero, mask])
        return bias, valid

    return b.memo(("attention-mask", mask, dtype), make)


def _hide_future(b: Builder, node: Node, scores: str) -> str:
    """torch's is_causal: keep the lower-left triangle of an [S, L] grid (top-left aligned).

    The hidden scores are replaced by -inf, not added to: a NaN or Inf in a key after the row's
    position must not reach that row, as in torch's default is_causal kernel and dayzero's own
    attention kernels (NaN + -inf would be NaN, which is what an additive mask gives).
    """
    q, k = node.inputs[0].type, node.inputs[1].type
    grid = b.op1("ConstantOfShape", [b.dims([q.shape[-2], k.shape[-2]])],
                 value=fill_value(True, DType.bool))
    window = node.attrs["window"]
    if window is not None:  # and the keys i - window < j
        grid = b.op1("Trilu", [grid, b.const(1 - window, DType.i64)], upper=1)
    keep = b.op1("Trilu", [grid, b.const(0, DType.i64)], upper=0)
    return b.op1("Where", [keep, scores, b.const(-math.inf, in_dtype(node))])


def _repeat_heads(b: Builder, node: Node, i: int, name: str) -> str:
    """k or v with each of its heads repeated Hq / Hk times (torch's enable_gqa semantics)."""
    q, kv = node.inputs[0].type, node.inputs[i].type
    rep = q.shape[-3] // kv.shape[-3]
    if rep == 1:
        return name
    lead = list(kv.shape[:-3])
    wide = lead + [kv.shape[-3], rep, kv.shape[-2], kv.shape[-1]]
    spread = b.op1("Expand", [b.op1("Unsqueeze", [name, b.ints([kv.rank - 2])]), b.dims(wide)])
    return b.op1("Reshape", [spread, b.dims(lead + [q.shape[-3], kv.shape[-2], kv.shape[-1]])])


def _scale(node: Node) -> float:
    scale = node.attrs["scale"]
    return 1.0 / math.sqrt(int(node.inputs[0].type.shape[-1])) if scale is None else float(scale)


def sdpa(b: Builder, node: Node, x: list) -> list:
    """softmax(q k^T * scale + mask) v with standard ops."""
    q, k, v, mask = x
    dtype, rank = in_dtype(node), node.inputs[0].type.rank
    if node.attrs["enable_gqa"]:
        k, v = _repeat_heads(b, node, 1, k), _repeat_heads(b, node, 2, v)
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    scores = b.op1("MatMul", [q, b.op1("Transpose", [k], perm=perm)])
    scores = b.op1("Mul", [scores, b.const(_scale(node), dtype)])
    if node.attrs["softcap"] is not None:  # softcap * tanh(scores / softcap), before the mask
        cap = b.const(float(node.attrs["softcap"]), dtype)
        scores = b.op1("Mul", [b.op1("Tanh", [b.op1("Div", [scores, cap])]), cap])
    bias, valid = mask_terms(b, node, mask)
    if bias is not None:
        scores = b.op1("Add", [scores, bias])
    if node.attrs["is_causal"]:
        scores = _hide_future(b, node, scores)
    out = b.op1("MatMul", [b.op1("Softmax", [scores], axis=-1), v])
    return [out if valid is None else b.op1("Mul", [out, valid])]


# MultiHeadAttention's unidirectional mode adds its mask to the scores, so a NaN or Inf in a key
# after a row's position reaches that row; torch's is_causal hides it (see _hide_future).
CAUSAL_MHA = ("is_causal: MultiHeadAttention adds the causal mask, so a non-finite key after a "
              "row's position would reach that row (torch's is_causal hides it)")


def mha_fits(node: Node) -> str | None:
    """None when MultiHeadAttention can run this node, else why it cannot."""
    q, k, v = (node.inputs[i].type for i in range(3))
    if q.rank != 4 or k.rank != 4 or v.rank != 4:
        return "q, k and v are not [batch, heads, seq, head_size]"
    if not all(is_static(d) for d in (q.shape[1], q.shape[3], k.shape[1], v.shape[1], v.shape[3])):
        return "head count or head size is symbolic"
    if q.shape[3] != v.shape[3]:
        return "value head size differs from the query's"
    if k.shape[1] != q.shape[1] and not node.attrs["enable_gqa"]:
        return "key heads differ from query heads without enable_gqa"
    if node.attrs["is_causal"]:
        return CAUSAL_MHA
    if node.attrs["softcap"] is not None:
        return "MultiHeadAttention has no softcap"
    if node.attrs["scale"] == 0:
        return "MultiHeadAttention reads scale 0 as 1 / sqrt(head_size)"
    mask = node.inputs[3]
    if mask is not None and (mask.type.rank > 4 or not mask.type.dtype.is_float
                             and mask.type.dtype != DType.bool):
        return "the mask is not a bool or float mask of rank <= 4"
    return None


def mha(b: Builder, node: Node, x: list) -> list:
    """com.microsoft.MultiHeadAttention on [B, S, N*H] queries and [B, N, L, H] keys/values."""
    q_t = node.inputs[0].type
    batch, heads, seq, size = q_t.shape
    q, k, v, mask = x
    k, v = _repeat_heads(b, node, 1, k), _repeat_heads(b, node, 2, v)
    bsnh = b.op1("Transpose", [q], perm=[0, 2, 1, 3])
    query = b.op1("Reshape", [bsnh, b.dims([batch, seq, heads * size])])
    bias, valid = mask_terms(b, node, mask)
    if bias is not None:
        bias = attention_bias(b, node.inputs[3].type, q_t.shape[2],
                              node.inputs[1].type.shape[2], bias)
    out = b.op1("MultiHeadAttention", [query, k, v, None, None, bias], domain="com.microsoft",
                num_heads=int(heads), scale=_scale(node))
    out = b.op1("Reshape", [out, b.dims([batch, seq, heads, size])])
    out = b.op1("Transpose", [out], perm=[0, 2, 1, 3])
    return [out if valid is None else b.op1("Mul", [out, valid])]


def attention_bias(b: Builder, m, q_len, k_len, bias: str) -> str:
    """The mask (of type `m`) as MHA's attention_bias: [B or 1, N or 1, S, L], S and L never
    broadcast."""
    if m.rank < 4:
        bias = b.op1("Unsqueeze", [bias, b.ints(list(range(4 - m.rank)))])
    full = [1] * (4 - m.rank) + list(m.shape)
    target = [full[0], full[1], q_len, k_len]
    if any(isinstance(d, int) and d == 1 for d in full[2:]):
        bias = b.op1("Expand", [bias, b.dims(target)])
    return bias
