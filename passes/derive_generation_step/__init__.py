"""derive_generation_step: turn a causal LM's full forward into one step of KV-cached generation.

torch.export traces what a user's model computes for a whole sequence (`input_ids` [1, S] ->
logits [1, S, V], no cache). Generation needs a step that reads the keys and values of earlier
tokens from a cache instead of recomputing them. In a decoder only attention reads other tokens'
rows; every other op computes token t's row from token t's rows. So the step is that forward
with three rewrites and a proof, whatever the architecture:

- **positions**: the sequence's `arange(0, S)` (rotary tables, absolute position embeddings
  read it) becomes the graph input `positions` [S]: token t of the step sits at position
  `positions[t]`, wherever its sequence is;
- **attention**: each attention becomes `paged_attention` over that layer's cache pool
  (`k_cache_<i>`, `v_cache_<i>` [kv_slots, kv_heads, head_size]) and the step's slot lists
  (`seq_slots`, `token_seq`, `token_len`); the block's window and softcap carry over; its new
  rotated keys and values become outputs (`key_<i>`, `value_<i>`) that the runtime writes into
  the pool. The KV cache is derived at the attention op: a block the fusion recognised whole
  (`multi_head_attention`) pages its projections and rotary tables, and any other causal
  `scaled_dot_product_attention` pages its query, key and value as they enter it, whatever
  computed them (partial rotary and a concat, a QKV split any way, q/k norms: its
  step_attention module); a `latent_attention` block (DeepSeek's MLA) becomes
  `paged_latent_attention` instead, whose two pools hold each token's compressed latent and
  shared rotary key (kv_lora_rank + rope_dim values, not the expanded per-head keys and
  values), its outputs the step's latents and rotary keys;
- **logits**: only the rows in `logit_indices` (each sequence's last token of the step) are
  computed: the row selection moves back through the row-wise tail of the graph (lm_head,
  final softcapping), so a prompt of 512 tokens pays the vocabulary projection once;
- **proof**: every output row is computed from its own token's rows, the paged attentions
  being the only readers of other tokens (a dataflow over the step: its token_rows module).

The step is a packed batch: S tokens from any number of sequences (a prompt chunk, or one next
token each), so one graph serves prefill, decode and a server's mixed batches. An attention that
is not causal, a mask not proven causal, or a node that still reads the whole sequence is an
error naming the node, its source line and why: the step never silently recomputes the whole
sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from compiler.errors import DayzeroError
from compiler.ir import Graph
from compiler.ir.dtypes import DType
from compiler.ir.graph import Node
from compiler.ir.ops.registry import get_op
from compiler.ir.symbolic import equal, symbol
from compiler.ir.types import TensorType

from ..base import Pass, PassResult
from ..eliminate_dead_code import EliminateDeadCode
from ..registry import register_pass
from .step_attention import SDPA as _SDPA
from .step_attention import Pool, heads_misfit, page_sdpa, paged_block, replace
from .token_rows import Mixed, TokenRows

TOKENS_INPUT = "input_ids"
KV_SLOTS = "kv_slots"          # size symbol: token slots in one layer's cache pool
STEP_SEQUENCES = "step_seqs"   # size symbol: sequences in a step
STEP_KEYS = "step_keys"        # size symbol: longest key list of a step's sequences
STEP_LOGITS = "step_logits"    # size symbol: rows of logits a step returns
_MAX_SLOTS = 1 << 40
# the attention blocks a step pages: each reads [cached ; new] keys from its layer's two pools
_PAGED = frozenset({"multi_head_attention", "latent_attention"})
# ops a logits row selection moves through: each output row depends on the same input row only
_ROW_WISE_KINDS = frozenset({"elementwise"})
_ROW_WISE_OPS = frozenset({"linear", "fused_linear", "quantized_linear", "rms_norm",
                           "layer_norm", "cast"})


@register_pass
@dataclass(frozen=True)
class DeriveGenerationStep(Pass):
    """Needs a causal LM forward (`input_ids` [1, S] -> logits [1, S, V], every attention a
    causal `multi_head_attention`, `latent_attention` or `scaled_dot_product_attention`);
    guarantees a step graph whose only token-mixing ops are `paged_attention` and
    `paged_latent_attention` (proven), with the cache and slot inputs and the new keys and
    values as outputs (module docstring). Compiling for generation appends it to the
    pipeline."""

    name = "derive_generation_step"
    summary = ("a causal LM's forward as one packed, KV-cached generation step (positions, "
               "paged attention, selected logits)")
    # int8: the cache pools are int8 with a float32 scale per token and head (inputs
    # k_scale_<i>, v_scale_<i>), a quarter of the bytes of f32
    kv_cache_dtype: Literal["f32", "int8"] = "f32"

    def run(self, graph: Graph) -> PassResult:
        tokens = _token_symbol(graph)
        attention = _attention_blocks(graph, tokens)
        _, hi = graph.symbols[tokens.name]
        graph.symbols[tokens.name] = (1, hi)  # a decode step has one token
        _replace_positions(graph, tokens)
        if not attention:  # an attention written out in ops: the proof names where it mixes
            _check_rows(graph, tokens)
            raise DayzeroError("the model has no attention op: nothing to cache",
                               "task text-generation", "compile it with --task forward")
        _page_attention(graph, attention, tokens, self.kv_cache_dtype == "int8")
        _check_rows(graph, tokens)
        _select_logits(graph, hi)
        EliminateDeadCode().run(graph)  # the masks, tables and the tail the step replaced
        return PassResult(graph, True)


def _token_symbol(graph: Graph):
    ids = next((v for v in graph.inputs if v.name == TOKENS_INPUT), None)
    if ids is None or ids.type.rank != 2 or ids.shape[0] != 1 or isinstance(ids.shape[1], int):
        raise DayzeroError(
            "a generation step is derived from a forward of `input_ids` [1, seq] with a dynamic "
            f"seq; this graph's inputs are {', '.join(f'{v.name} {v.type}' for v in graph.inputs)}",
            "task text-generation",
            "export the causal LM with input_ids of batch 1 and a dynamic sequence dim")
    if len(graph.outputs) != 1 or graph.outputs[0].type.rank != 3 \
            or not equal(graph.outputs[0].shape[1], ids.shape[1]):
        raise DayzeroError(f"a causal LM returns logits [1, seq, vocab]; this graph returns "
                           f"{', '.join(str(v.type) for v in graph.outputs)}",
                           "task text-generation",
                           "return only the logits (use_cache=False, .logits)")
    return ids.shape[1]


def _where(node: Node) -> str:
    return f"node %{node.outputs[0].name} ({node.op}) at {node.loc or 'unknown location'}"


def _attention_blocks(graph: Graph, tokens) -> list[Node]:
    """Every attention, each checked to be a causal one the step can page: a fused block, or a
    `scaled_dot_product_attention` over [1, heads, tokens, head_size] whatever computed its
    query, key and value (the proof that they are computed token by token comes after paging)."""
    blocks = []
    for node in graph.nodes:
        if node.op in _PAGED or node.op == _SDPA:
            why = _unpageable(node, tokens)
            if why:
                raise DayzeroError(f"attention {_where(node)} cannot read a KV cache: {why}",
                                   "task text-generation",
                                   "compile with --task forward, or report the model: its "
                                   "attention needs a fusion rule")
            blocks.append(node)
        elif get_op(node.op).kind == "attention":
            raise DayzeroError(f"attention {_where(node)} has no paged form, so no KV cache "
                               "can be derived", "task text-generation",
                               "compile with --task forward, or report the model")
    return blocks


def _unpageable(node: Node, tokens) -> str | None:
    # q, and the keys (a latent block's latent: one row per key), with their token axis
    q, k, mask = node.inputs[0], node.inputs[1], node.inputs[-1]
    if node.op == _SDPA:
        mask = node.inputs[3]
    if not node.attrs.get("is_causal"):
        return "it is not causal" + (" (its mask was not proven causal: "
                                     "recognize_causal_masks says why with --report)"
                                     if mask is not None else "")
    if mask is not None:
        return "it has a mask besides causality (a padding mask input?)"
    if node.op == _SDPA:
        return heads_misfit(node, tokens)
    axis = 2 if node.op == "latent_attention" else 1
    if not (equal(q.shape[axis], tokens) and equal(k.shape[axis], tokens)):
        return f"its queries {q.type} and keys {k.type} are not the sequence's tokens"
    return None


def _replace_positions(graph: Graph, tokens) -> None:
    """Every `arange(0, S)` reads the step's `positions` instead."""
    positions = None
    for node in list(graph.nodes):
        attrs = node.attrs
        if node.op != "arange" or attrs["start"] != 0 or attrs["step"] != 1 \
                or not equal(attrs["end"], tokens):
            continue
        if positions is None:
            positions = graph.add_input("positions", TensorType(DType.i64, (tokens,)))
        value = positions
        if attrs["dtype"] != DType.i64:
            value = graph.add_node("cast", [positions], {"dtype": attrs["dtype"]}, loc=node.loc,
                                   names=["positions_cast"], before=node).outputs[0]
        graph.replace_uses(node.outputs[0], value)
        graph.remove_nodes([node])


def _page_attention(graph: Graph, blocks: list[Node], tokens, int8: bool) -> None:
    slots = symbol(KV_SLOTS)
    graph.symbols[KV_SLOTS] = (1, _MAX_SLOTS)
    seqs, keys = symbol(STEP_SEQUENCES), symbol(STEP_KEYS)
    graph.symbols[STEP_SEQUENCES] = (1, graph.symbols[tokens.name][1])
    # a sequence has no more keys than positions: the exported range bounds the slot lists
    graph.symbols[STEP_KEYS] = (1, graph.symbols[tokens.name][1])
    shared = [graph.add_input("seq_slots", TensorType(DType.i64, (seqs, keys))),
              graph.add_input("token_seq", TensorType(DType.i64, (tokens,))),
              graph.add_input("token_len", TensorType(DType.i64, (tokens,)))]
    for layer, node in enumerate(blocks):
        if node.op == "latent_attention":
            _page_latent(graph, node, layer, slots, shared, int8)
        elif node.op == _SDPA:
            page_sdpa(graph, node, Pool(layer, slots, shared, int8))
        else:
            q, k, v, cos, sin, _ = node.inputs
            replace(graph, node, paged_block(graph, node, [q, k, v, cos, sin],
                                              Pool(layer, slots, shared, int8)))


def _page_latent(graph: Graph, node: Node, layer: int, slots, shared: list, int8: bool) -> None:
    """latent_attention -> paged_latent_attention over the layer's pools of latents
    (`k_cache_<i>` [slots, 1, kv_lora_rank]) and rotary keys (`v_cache_<i>` [slots, 1, dr])."""
    q, latent, k_rope, weight, _ = node.inputs
    caches = [graph.add_input(f"{name}_cache_{layer}",
                              TensorType(DType.i8 if int8 else q.dtype, (slots, 1, width)))
              for name, width in (("k", latent.shape[-1]), ("v", k_rope.shape[-1]))]
    scales = [graph.add_input(f"{name}_scale_{layer}", TensorType(DType.f32, (slots, 1)))
              for name in ("k", "v")] if int8 else []
    attrs = {name: node.attrs.get(name) for name in ("num_heads", "nope_head_dim", "v_head_dim",
                                                    "scale", "window", "softcap")}
    paged = graph.add_node("paged_latent_attention",
                           [q, latent, k_rope, weight, *caches, *shared, *scales], attrs,
                           loc=node.loc, before=node,
                           names=[node.outputs[0].name + "_paged", f"key_{layer}",
                                  f"value_{layer}"])
    replace(graph, node, paged)


def _select_logits(graph: Graph, max_tokens) -> None:
    """logits [1, S, V] -> [1, n, V] at `logit_indices`, selected as early as the row-wise
    tail of the graph allows."""
    rows = symbol(STEP_LOGITS)
    graph.symbols[STEP_LOGITS] = (1, max_tokens)
    indices = graph.add_input("logit_indices", TensorType(DType.i64, (rows,)))
    chain, value = [], graph.outputs[0]
    while value.producer is not None and _row_wise(graph, value.producer) \
            and len(value.users) <= 1 and value.shape[:2] == value.producer.inputs[0].shape[:2]:
        chain.append(value.producer)
        value = value.producer.inputs[0]
    chain.reverse()
    # the rebuilt tail goes before the old tail's last node: whatever the tail reads (a
    # softcap's constants sit just before their op) is defined by then
    anchor = chain[-1] if chain else None
    selected = graph.add_node("index_select", [value, indices], {"dim": 1}, before=anchor,
                              names=["selected_rows"], loc=anchor.loc if anchor else None
                              ).outputs[0]
    for node in chain:
        args = [selected if v is node.inputs[0] else v for v in node.inputs]
        names = [out.name + "_rows" for out in node.outputs]
        selected = graph.add_node(node.op, args, dict(node.attrs), loc=node.loc, before=anchor,
                                  names=names).outputs[0]
    graph.outputs[0] = selected
    graph.version += 1


def _row_wise(graph: Graph, node: Node) -> bool:
    """Each output row of `node` reads only the same row of its first input (the others are
    weights or scalars)."""
    if len(node.outputs) != 1 or node.inputs[0] is None or node.inputs[0].type.rank < 2:
        return False
    if node.op not in _ROW_WISE_OPS and get_op(node.op).kind not in _ROW_WISE_KINDS:
        return False
    others = [v for v in node.inputs[1:] if v is not None]
    return all(graph.is_weight(v) or (v.producer is not None and v.producer.op == "constant")
               or v.type.rank == 0 for v in others)


def _check_rows(graph: Graph, tokens) -> None:
    """Prove that every output row is computed from its own token's rows (token_rows.py): the
    step's tokens then get what the whole forward gives them. What still reads the whole
    sequence would mix the step's unrelated tokens: it is named, with why."""
    rows = TokenRows(tokens)
    for value, axis in ((graph.outputs[0], 1), *((v, 0) for v in graph.outputs[1:])):
        fact = rows.of(value)
        if isinstance(fact, Mixed):
            where = _where(fact.node) if fact.node is not None else "a graph input"
            raise DayzeroError(f"{where} depends on the whole sequence, which a KV-cached step "
                               f"does not see: {fact.why}", "task text-generation",
                               "compile with --task forward, or report the model")
        if fact != axis:
            raise DayzeroError(f"output %{value.name} {value.type} does not hold one row per "
                               f"token on axis {axis}", "task text-generation",
                               "return the logits [1, seq, vocab]")
