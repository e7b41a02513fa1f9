"""paged_latent_attention against DeepSeek's expanded form: a float64 reference written here from
the op's definition (keys and values expanded per head from each visible token's latent by the
up-projection, the shared rotary key appended, causal softmax), over packed steps of several
sequences with latents in scattered pool slots; the op's absorbed decomposition runs on the
reference interpreter in float32."""

from __future__ import annotations

import math

import numpy as np
import pytest

from backends.reference.interpreter import run_graph
from compiler.ir import DType, Graph, TensorType
from compiler.ir.ops import ShapeError, get_op
from compiler.ir.ops.paged_latent import INPUTS

HEADS, NOPE, ROPE, V_SIZE, RANK = 4, 8, 6, 5, 12
NAMES = [n.rstrip("?") for n in INPUTS.split()]


def _step(sequences, pool=48, seed=0, int8=False):
    """Arrays of a step: per sequence (cached, new) tokens; cached latents in random slots."""
    rng = np.random.default_rng(seed)
    tokens = sum(new for _, new in sequences)
    length = max(c + n for c, n in sequences) + 2
    free = list(rng.permutation(pool))
    slots = np.full((len(sequences), length), -1, np.int64)
    token_seq, token_len, t = [], [], 0
    for i, (cached, new) in enumerate(sequences):
        slots[i, :cached] = [free.pop() for _ in range(cached)]
        slots[i, cached:cached + new] = [-2 - (t + j) for j in range(new)]
        token_seq += [i] * new
        token_len += [cached + j + 1 for j in range(new)]
        t += new
    f = np.float32
    out = {"q": rng.standard_normal((1, HEADS, tokens, NOPE + ROPE)).astype(f),
           "latent": rng.standard_normal((1, 1, tokens, RANK)).astype(f),
           "k_rope": rng.standard_normal((1, 1, tokens, ROPE)).astype(f),
           "weight": (rng.standard_normal((HEADS * (NOPE + V_SIZE), RANK)) / 3).astype(f),
           "latent_cache": rng.standard_normal((pool, 1, RANK)).astype(f),
           "rope_cache": rng.standard_normal((pool, 1, ROPE)).astype(f),
           "seq_slots": slots, "token_seq": np.asarray(token_seq, np.int64),
           "token_len": np.asarray(token_len, np.int64)}
    if int8:
        for cache, scale in (("latent_cache", "latent_scale"), ("rope_cache", "rope_scale")):
            out[scale] = (rng.uniform(0.01, 0.05, (pool, 1))).astype(f)
            out[cache] = rng.integers(-127, 128, out[cache].shape).astype(np.int8)
    return out


def _expanded(a, scale=None, window=None, softcap=None):
    """The attention of every step token, keys and values expanded per head (float64)."""
    wide = {k: v.astype(np.float64) for k, v in a.items()}
    cache_c, cache_r = wide["latent_cache"][:, 0], wide["rope_cache"][:, 0]
    if "latent_scale" in a:
        cache_c, cache_r = cache_c * wide["latent_scale"], cache_r * wide["rope_scale"]
    w = wide["weight"].reshape(HEADS, NOPE + V_SIZE, RANK)
    scale = scale or 1 / math.sqrt(NOPE + ROPE)
    out = np.zeros((a["token_seq"].size, HEADS, V_SIZE))
    for t, (seq, seen) in enumerate(zip(a["token_seq"], a["token_len"])):
        first = 0 if window is None else max(0, seen - window)
        rows = [s for s in a["seq_slots"][seq][first:seen] if s != -1]
        c = np.stack([cache_c[s] if s >= 0 else wide["latent"][0, 0, -2 - s] for s in rows])
        r = np.stack([cache_r[s] if s >= 0 else wide["k_rope"][0, 0, -2 - s] for s in rows])
        for h in range(HEADS):
            keys = np.concatenate([c @ w[h, :NOPE].T, r], axis=1)
            scores = keys @ wide["q"][0, h, t] * scale
            if softcap:
                scores = np.tanh(scores / softcap) * softcap
            p = np.exp(scores - scores.max())
            out[t, h] = (p / p.sum()) @ (c @ w[h, NOPE:].T)
    return out.reshape(1, -1, HEADS * V_SIZE)


def _run(a, **attrs):
    g = Graph("paged_latent")
    values = [g.add_input(n, TensorType(DType.from_numpy(a[n].dtype), a[n].shape))
              if n in a else None for n in NAMES]
    node = g.add_node("paged_latent_attention", values,
                      dict(num_heads=HEADS, nope_head_dim=NOPE, v_head_dim=V_SIZE, **attrs))
    g.outputs = list(node.outputs)
    return [t.numpy() for t in run_graph(g, {}, [a[v.name] for v in g.inputs])]


STEPS = {"prefill": [(0, 7)], "decode": [(19, 1), (6, 1)], "mixed": [(9, 4), (23, 1), (2, 1)]}


@pytest.mark.parametrize("name", STEPS)
@pytest.mark.parametrize("attrs", [{}, {"scale": 0.3, "softcap": 2.5}, {"window": 5}],
                         ids=["plain", "softcap", "window"])
def test_absorbed_step_matches_expanded_keys_and_values(name, attrs):
    a = _step(STEPS[name])
    out, new_c, new_r = _run(a, **attrs)
    np.testing.assert_allclose(out, _expanded(a, **attrs), rtol=1e-5, atol=1e-5)
    # the rows the runtime writes to the pools are the step's own latents and rotary keys
    np.testing.assert_array_equal(new_c, a["latent"][0, 0][:, None])
    np.testing.assert_array_equal(new_r, a["k_rope"][0, 0][:, None])


def test_int8_pools_are_dequantized_by_their_scales():
    a = _step(STEPS["mixed"], int8=True)
    np.testing.assert_allclose(_run(a)[0], _expanded(a), rtol=1e-5, atol=1e-5)


def test_a_nan_latent_reaches_exactly_the_tokens_that_see_it():
    a = _step([(9, 4), (23, 1)])
    a["latent_cache"][a["seq_slots"][0, 3]] = np.nan   # key 3 of sequence 0
    unused = sorted(set(range(48)) - set(a["seq_slots"].ravel().tolist()))[0]
    a["rope_cache"][unused] = np.inf                      # a slot no sequence lists
    out = _run(a)[0].reshape(5, HEADS * V_SIZE)
    assert np.isnan(out[:4]).all() and np.isfinite(out[4]).all()


def test_shapes_are_checked():
    a = _step(STEPS["decode"])
    types = [TensorType(DType.from_numpy(a[n].dtype), a[n].shape) for n in NAMES[:9]]
    attrs = dict(num_heads=HEADS, nope_head_dim=NOPE, v_head_dim=V_SIZE, scale=None,
                 window=None, softcap=None)
    out = get_op("paged_latent_attention").infer(types, attrs)
    assert [t.shape for t in out] == [(1, 2, HEADS * V_SIZE), (2, 1, RANK), (2, 1, ROPE)]
    bad = types[:4] + [TensorType(DType.f32, (48, 2, RANK))] + types[5:]
    with pytest.raises(ShapeError, match=r"must be \[slots, 1, 12\] and \[slots, 1, 6\]"):
        get_op("paged_latent_attention").infer(bad, attrs)
