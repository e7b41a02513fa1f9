"""DeepSeek's multi-head latent attention (MLA) block: `latent_attention`.

transformers' DeepSeek-V2/V3 attention expands keys and values from the compressed latent and
appends the shared rotary key to every head (see compiler/ir/ops/latent.py):

    kv = kv_b_proj(c).view(b, t, h, dn + dv).transpose(1, 2)  # linear, reshape, permute
    k_nope, v = split(kv, [dn, dv], -1)                         # two slices of the last dim
    k = cat(k_nope, k_rope.expand(b, h, t, dr))                 # written into new_empty slices;
                                                                # remove_noops makes it a concat
    o = attention(q, k, v, mask).transpose(1, 2).reshape(b, s, h * dv)

That whole block, from the latent c and the rotated k_rope on, becomes one `latent_attention`
whatever form the rotary took before it (V2's complex multiply, V3's interleaved halves): the
query is taken as assembled. The expanded intermediates may have no other reader.
"""

from __future__ import annotations

from ..rewrite import RuleSet, rule
from .common import misfit, shape_is
from .heads import _attend, _is_heads_first, _merge


def _latent_block(op, q, latent, weight, k_rope, mask):
    kv = op.linear(latent, weight, None, _name="kv")
    split = op.permute(op.reshape(kv, _name="kv_heads"), dims=_is_heads_first, _name="kv_split")
    k_nope = op.slice(split, dim=op.capture("nope_dim"), start=op.capture("nope_start"),
                      end=op.capture("nope_end"), step=1, _name="k_nope")
    value = op.slice(split, dim=op.capture("v_dim"), start=op.capture("v_start"),
                     end=op.capture("v_end"), step=1, _name="value")
    key = op.concat(k_nope, op.expand(k_rope, _name="k_shared"), dim=op.capture("key_dim"),
                    _name="key")
    return _merge(op, _attend(op, q, key, value, mask))


def _sizes(latent, kv_heads, b) -> tuple[int, int, int] | str:
    """(heads, dn, dv) from the block's shapes, or why they do not fit MLA."""
    batch, one, keys, _ = latent.shape if latent.type.rank == 4 else (None,) * 4
    if one != 1:
        return "the latent is not [batch, 1, keys, kv_lora_rank]"
    if kv_heads.type.rank != 4 or not shape_is(kv_heads, [batch, keys, *kv_heads.shape[2:]]):
        return "the expanded latent is not split into [batch, keys, heads, dn + dv]"
    heads, width = kv_heads.shape[2:]
    if not all(b[k] % 4 == 3 for k in ("nope_dim", "v_dim", "key_dim")):
        return "keys and values are not split along the head dim"
    nope, v_end = b["nope_end"], b["v_end"]
    if b["nope_start"] != 0 or b["v_start"] != nope or v_end != width or not isinstance(heads, int):
        return "the expanded latent is not split into [dn | dv] per head"
    return heads, nope, v_end - nope


def _check(ctx, q, latent, weight, k_rope, kv_heads, k_shared, attended, merged, mask=None,
           **b):
    sizes = _sizes(latent, kv_heads, b)
    if isinstance(sizes, str):
        return sizes
    heads, nope, v_size = sizes
    batch, _, keys, _ = latent.shape
    if k_rope.type.rank != 4 or not shape_is(k_shared, [batch, heads, keys, k_rope.shape[3]]):
        return "the rotary key is not one shared head expanded to every head"
    if b["enable_gqa"]:
        return "grouped-query attention over the expanded heads"
    seq = attended.shape[2]
    if not shape_is(merged, [batch, seq, heads * v_size]):
        return "the heads are not merged back to [batch, seq, heads * v_head_dim]"
    return misfit("latent_attention", [q, latent, k_rope, weight, mask], num_heads=heads,
                  nope_head_dim=nope, v_head_dim=v_size, scale=b["scale"],
                  is_causal=b["is_causal"], window=b["window"], softcap=b["softcap"])


def _rewrite(op, q, latent, weight, k_rope, kv_heads, nope_end, v_end, scale, is_causal,
             window, softcap, mask=None, **_):
    return op.latent_attention(q, latent, k_rope, weight, mask, num_heads=kv_heads.shape[2],
                               nope_head_dim=nope_end, v_head_dim=v_end - nope_end, scale=scale,
                               is_causal=is_causal, window=window, softcap=softcap)


LATENT_BLOCK = rule("latent_attention", _latent_block, _rewrite, check=_check)

RULES = RuleSet([LATENT_BLOCK], "latent")
