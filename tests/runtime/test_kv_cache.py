"""runtime.kv_cache: block bookkeeping, preemption order, and the stored values."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.errors import ArtifactError, InputError
from runtime.generation.spec import GenerationSpec, LayerCache
from runtime.kv_cache import BlockAllocator, CacheFullError, CacheLayout, LayerPools, PagedKVCache

LAYOUT = CacheLayout(layers=2, kv_heads=2, head_size=8, block_size=4)


def test_blocks_for_counts_keys_values_and_scales():
    assert LAYOUT.block_bytes == 2 * 2 * 4 * 2 * 8 * 4
    assert LAYOUT.blocks_for(10 * LAYOUT.block_bytes + 5) == 10
    int8 = CacheLayout(2, 2, 8, 4, "int8")
    assert int8.block_bytes == 2 * 2 * 4 * 2 * (8 + 4)
    with pytest.raises(InputError, match="holds no block") as info:
        LAYOUT.blocks_for(100)
    assert info.value.where == "generation.kv_cache_memory"


def test_tables_never_share_a_block_and_freed_blocks_are_reused():
    pool = BlockAllocator(num_blocks=6, block_size=4)
    a = list(pool.grow("a", 5))          # 2 blocks
    b = list(pool.grow("b", 4))          # 1 block
    a = list(pool.grow("a", 9))          # grows to 3 blocks, keeps its first two
    assert a[:2] == [0, 1] and not set(a) & set(b) and pool.used == 4
    assert pool.fits("b", 12) and not pool.fits("c", 13)
    pool.release("a")
    assert pool.used == 1 and sorted(pool.free) == [0, 1, 3, 4, 5] and b == [2]
    c = pool.grow("c", 12)
    assert not set(c) & set(b) and pool.used == 4


def test_a_full_pool_names_the_shortfall_and_the_newest_sequence_is_the_victim():
    pool = BlockAllocator(num_blocks=3, block_size=4)
    pool.grow("old", 8)
    pool.grow("new", 4)
    with pytest.raises(CacheFullError, match=r"sequence 'old' needs 1 more block.*0 of 3"):
        pool.grow("old", 9)
    assert pool.victim() == "new"
    pool.release(pool.victim())
    assert pool.grow("old", 9) and pool.victim() == "old"


def test_float_values_round_trip_across_block_boundaries():
    cache = PagedKVCache(LAYOUT, num_blocks=8)
    pool = BlockAllocator(8, LAYOUT.block_size)
    rng = np.random.default_rng(0)
    k, v = (rng.standard_normal((11, 2, 8)).astype(np.float32) for _ in "kv")
    k[3, 1, 2] = np.nan  # an f32 cache keeps what it is given
    table = pool.grow("s", 6)
    cache.write(1, table, 0, k[:6], v[:6])
    table = pool.grow("s", 11)
    cache.write(1, table, 6, k[6:], v[6:])          # starts mid-block
    got_k, got_v = cache.read(1, table, 11)
    np.testing.assert_array_equal(got_k, k)
    np.testing.assert_array_equal(got_v, v)
    assert not cache.read(0, table, 11)[0].any()    # the other layer untouched
    with pytest.raises(InputError, match="need 4 blocks; the table has 3"):
        cache.write(0, table, 11, k[:2], v[:2])


def test_int8_keeps_each_token_head_within_half_a_step_of_its_scale():
    layout = CacheLayout(1, 2, 8, 4, "int8")
    cache = PagedKVCache(layout, num_blocks=4)
    rng = np.random.default_rng(1)
    k = rng.standard_normal((7, 2, 8)).astype(np.float32) * rng.uniform(0.01, 10, (7, 2, 1))
    v = np.zeros_like(k)  # an all-zero head: scale 0, read back exactly
    cache.write(0, [2, 0], 0, k, v)
    got_k, got_v = cache.read(0, [2, 0], 7)
    step = np.abs(k).max(axis=-1, keepdims=True) / 127
    assert (np.abs(got_k - k) <= step / 2 + 1e-7).all()
    assert not got_v.any()
    k[4, 0, 1] = np.inf
    with pytest.raises(InputError, match="keys hold a NaN or Inf at token 4"):
        cache.write(0, [2, 0], 0, k, v)


@pytest.mark.parametrize("field, value", [("layers", 0), ("block_size", 2.5), ("dtype", "f8")])
def test_bad_layouts_name_the_key(field, value):
    args = {"layers": 1, "kv_heads": 1, "head_size": 4, field: value}
    with pytest.raises(InputError, match=field if field != "dtype" else "f8"):
        CacheLayout(**args)


# DeepSeek's latent attention: each layer's pools hold a 16-wide latent and an 8-wide rotary
# key per token (one head each), beside a layer of 2 KV heads of 8
MIXED = CacheLayout(2, 2, 8, 4, pools=(LayerPools(1, 16, 8), LayerPools(2, 8, 8)))


def test_layers_page_their_own_pool_shapes():
    assert MIXED.token_bytes == (16 + 8) * 4 + 2 * (8 + 8) * 4
    assert MIXED.block_bytes == 4 * MIXED.token_bytes
    assert CacheLayout(2, 2, 8, 4, "int8", MIXED.pools).token_bytes == (16 + 8 + 8) \
        + 2 * (8 + 8 + 8)
    cache = PagedKVCache(MIXED, num_blocks=5)
    assert cache.flat(0, 0).shape == (20, 1, 16) and cache.flat(0, 1).shape == (20, 1, 8)
    assert cache.flat(1, 0).shape == (20, 2, 8)
    rng = np.random.default_rng(2)
    latent, rope = rng.standard_normal((6, 1, 16)), rng.standard_normal((6, 1, 8))
    cache.write(0, [3, 1], 0, latent, rope)
    got_latent, got_rope = cache.read(0, [3, 1], 6)
    np.testing.assert_array_equal(got_latent, latent.astype(np.float32))
    np.testing.assert_array_equal(got_rope, rope.astype(np.float32))
    assert not cache.read(1, [3, 1], 6)[0].any()


def test_a_pool_list_must_cover_every_layer():
    with pytest.raises(InputError, match="1 layer pools for 2 layers"):
        CacheLayout(2, 1, 8, pools=(LayerPools(1, 16, 8),))
    with pytest.raises(InputError, match="key_width=0"):
        CacheLayout(1, 1, 8, pools=(LayerPools(1, 0, 8),))


def _section(layers):
    return GenerationSpec((), 256, 64, (2,), 1 << 20, 4, 16, 16).to_manifest() | {
        "layers": layers}


def test_the_manifest_keeps_each_layers_cache_kind():
    layers = [[1, 16, 8, None, "latent"], [2, 8, 8, 4]]  # an attention entry as before
    spec = GenerationSpec.from_manifest(_section(layers), "m.dz")
    assert spec.layers == (LayerCache(1, 16, 8, None, "latent"), LayerCache(2, 8, 8, 4))
    assert spec.to_manifest()["layers"] == layers
    assert spec.cache_layout() == CacheLayout(2, 1, 16, 4, pools=MIXED.pools)


@pytest.mark.parametrize("entry", [[1, 16, 8, None, "expanded"], [1, 16, 8, None, "latent", 1],
                                   [1, 16, 0, None, "latent"]])
def test_a_bad_layer_entry_is_a_corrupt_artifact(entry):
    with pytest.raises(ArtifactError, match="generation.layers is missing or invalid"):
        GenerationSpec.from_manifest(_section([entry]), "m.dz")
