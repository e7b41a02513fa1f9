"""The generic shrinking of benchmarks/architecture_sweep.py: any transformers config made tiny.

One table (`SMALL`) of config attribute names -> small values (or rules from the default value),
applied to a config and every nested sub-config alike, so that hundreds of architectures build
small without a line of per-model code. An architecture the table does not fit fails to build
or run in transformers itself and is counted apart by the sweep ("no eager"), never adapted by
hand here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _layers(old: Any) -> Any:
    return 2


def _per_stage(base: int) -> Callable[[Any], Any]:
    """Per-stage widths (ResNet's hidden_sizes, ConvNeXT's dims): base, 2 base, 4 base, ..."""
    def rule(old: Any) -> Any:
        return [base * 2 ** i for i in range(len(old))] if isinstance(old, (list, tuple)) else base
    return rule


def _heads(old: Any) -> Any:
    """4 heads; a per-stage list (Swin, PVT) doubles from 2, dividing the per-stage widths."""
    return [2 * 2 ** i for i in range(len(old))] if isinstance(old, (list, tuple)) else 4


def _depths(old: Any) -> Any:
    return [1] * len(old) if isinstance(old, (list, tuple)) else 1


def _size(value: int) -> Callable[[Any], Any]:
    """`value`, or a list of it as long as the old list (image_size=[224, 224])."""
    return lambda old: [value] * len(old) if isinstance(old, (list, tuple)) else value


# config attribute -> small value (or old value -> small value). Applied to every config and
# nested sub-config that has the attribute set (None stays None: optional parts stay off).
SMALL: dict[str, Any] = {
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "model_dim",
                     "word_embed_proj_dim", "embedding_size", "projection_dim"), 64),
    **dict.fromkeys(("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers",
                     "decoder_layers", "num_decoder_layers"), _layers),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "num_heads",
                     "encoder_attention_heads", "decoder_attention_heads", "linear_num_heads",
                     "linear_num_key_heads", "linear_num_value_heads"), _heads),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "n_inner", "encoder_ffn_dim",
                     "decoder_ffn_dim", "ffn_hidden_size", "hidden_dim",
                     "shared_expert_intermediate_size", "shared_experts_intermediate_size",
                     "moe_shared_expert_intermediate_size"), 128),
    **dict.fromkeys(("head_dim", "linear_head_dim", "linear_key_head_dim",
                     "linear_value_head_dim"), 16),
    **dict.fromkeys(("moe_intermediate_size", "expert_ffn_hidden_size"), 64),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "moe_topk", "num_experts_per_token", "moe_k"), 2),
    **dict.fromkeys(("n_shared_experts", "num_shared_experts", "moe_num_shared_experts",
                     "n_group", "topk_group", "num_expert_group", "first_k_dense_replace"), 1),
    # latent attention: rotary part as wide as head_dim, which some configs derive from it
    **dict.fromkeys(("kv_lora_rank", "q_lora_rank"), 32),
    **dict.fromkeys(("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"), 16),
    "rotary_dim": 8,  # partial rotary (CodeGen, GPT-J): half of head_dim
    "vocab_size": 512,
    **dict.fromkeys(("max_position_embeddings", "n_positions", "max_seq_len"), 128),
    "image_size": _size(64), "patch_size": _size(8), "window_size": _size(4),
    **dict.fromkeys(("hidden_sizes", "embed_dims", "dims", "neck_hidden_sizes"), _per_stage(16)),
    "depths": _depths,
}
# key/value heads: 1 stays 1 (multi-query), as many as the heads stays so, else 2 (grouped)
# set even where the default leaves them unset: DeepSeek-V2's default routes to None experts,
# dots.llm1's default builds None routed and shared experts (neither default config builds). Not
# `num_experts`: unset there means a dense model (Gemma 4), which stays dense. head_dim: unset
# means hidden / heads = 16 to Mixtral, but Hunyuan's attention computes None ** -0.5 from it.
SET_WHEN_UNSET = ("num_experts_per_tok", "n_routed_experts", "n_shared_experts", "head_dim")
LAYER_COUNTS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers")
KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num",
            "num_query_groups")
VOCAB = SMALL["vocab_size"]

def small_value(name: str, old: Any) -> Any:
    """The table's value for attribute `name` whose default is `old` (old when not in the table,
    None, a bool, or of a kind the rule does not fit)."""
    rule = SMALL.get(name)
    if old is None and name in SET_WHEN_UNSET:
        return rule
    if rule is None or old is None or isinstance(old, bool):
        return old
    if callable(rule):
        return rule(old)
    if isinstance(old, (list, tuple)) and all(isinstance(v, int) for v in old):
        return [rule] * len(old)
    return rule if isinstance(old, int) else old


def kv_heads(kv: Any, heads: Any) -> Any:
    if not isinstance(kv, int) or isinstance(kv, bool):
        return kv
    if kv == 1:
        return 1
    return _heads(heads) if isinstance(heads, int) and kv >= heads else 2


def shrink_kwargs(config: Any) -> dict[str, Any]:
    """The keyword arguments that rebuild `config` small: the table's attributes, key/value
    heads, per-layer lists (layer_types) cut to two layers of both kinds, token ids inside the
    small vocabulary, and every nested sub-config the same way (as a dict, which configs accept
    for their sub-configs)."""
    from transformers import PretrainedConfig

    values = {k: v for k, v in vars(config).items() if not k.startswith("_")}
    layers = next((values[n] for n in LAYER_COUNTS if isinstance(values.get(n), int)), None)
    heads = next((values[h] for h in ("num_attention_heads", "n_head", "num_heads")
                  if isinstance(values.get(h), int)), None)
    out: dict[str, Any] = {}
    for name, old in values.items():
        if isinstance(old, PretrainedConfig):
            out[name] = shrink_kwargs(old)
            continue
        new = _small_attribute(name, old, heads)
        if isinstance(new, (list, tuple)) and layers and layers > 2 and len(new) == layers:
            new = _two_layers(list(new))
        if new != old:
            out[name] = new
    out.update(_ssm_heads(values, out))
    return out


def _ssm_heads(values: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    """A state-space mixer's heads (Mamba2: `expand`, `num_heads`, `head_dim`) span the expanded
    width, hidden x expand = heads x head_dim, which its config validates: the heads follow
    from the shrunk hidden size and head_dim, as the key/value heads follow the heads."""
    if not all(isinstance(values.get(k), int) for k in ("expand", "num_heads", "head_dim")):
        return {}
    hidden = out.get("hidden_size", values.get("hidden_size"))
    head_dim = out.get("head_dim", values["head_dim"])
    if not isinstance(hidden, int) or (hidden * values["expand"]) % head_dim:
        return {}
    return {"num_heads": hidden * values["expand"] // head_dim}


def _two_layers(per_layer: list) -> list:
    """A per-layer list for two layers: the first entry and the first that differs from it
    (sliding then full attention, dense then sparse MLP), so both kinds stay covered."""
    return [per_layer[0], next((x for x in per_layer if x != per_layer[0]), per_layer[1])]


def _small_attribute(name: str, old: Any, heads: Any) -> Any:
    if name in KV_HEADS:
        return kv_heads(old, heads)
    if name.endswith("token_id") and _out_of_vocab(old):
        return _in_vocab(old)
    return small_value(name, old)


def _out_of_vocab(ids: Any) -> bool:
    ids = ids if isinstance(ids, list) else [ids]
    return any(isinstance(i, int) and i >= VOCAB for i in ids)


def _in_vocab(ids: Any) -> Any:
    if isinstance(ids, list):
        return [_in_vocab(i) for i in ids]
    return VOCAB - 1 - (ids % 8) if isinstance(ids, int) and ids >= VOCAB else ids


def shrink(config: Any) -> Any:
    """`config` rebuilt from its class with `shrink_kwargs` (its __init__ derives the rest:
    layer types, head dims)."""
    return type(config)(**shrink_kwargs(config))


def find(config: Any, name: str, default: Any) -> Any:
    """`name` on `config` or the first sub-config that sets it."""
    from transformers import PretrainedConfig

    if getattr(config, name, None) is not None:
        return getattr(config, name)
    for value in vars(config).values():
        if isinstance(value, PretrainedConfig):
            found = find(value, name, None)
            if found is not None:
                return found
    return default
