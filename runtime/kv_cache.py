"""The paged KV cache: fixed-size blocks of one preallocated pool, per-sequence block tables.

As vLLM pages it: a sequence's keys and values live in blocks of `block_size` tokens anywhere in
the pool, listed in its block table, so sequences of any length share one allocation sized once
from the config (`generation.kv_cache_memory`), nothing is copied when a sequence grows, and a
finished sequence's blocks are free at once (or, full blocks of a cached prefix, kept for the
next request until the pool needs them: prefix_cache.py). `BlockAllocator` keeps the books
(which block belongs to whom; which sequence to preempt when the pool runs dry: the newest,
whose recompute costs least and which has waited least); `PagedKVCache` holds the data, two
[blocks, block_size, heads, width] arrays per layer: keys and values of an attention layer, or,
for DeepSeek's latent attention, the compressed latent and the shared rotary key (`LayerPools`;
the step graph names them `k_cache_<i>` and `v_cache_<i>` alike). With `dtype="int8"` each
token's head is stored as int8 with a float32 scale (max |x| / 127), a quarter of fp32's bytes;
int8 cannot hold NaN or Inf, so writing one is refused rather than silently clipped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from compiler.errors import DayzeroError, InputError

from .prefix_cache import PrefixCache

_ITEMSIZE = {"f32": 4, "f16": 2, "int8": 1}
_NUMPY = {"f32": np.float32, "f16": np.float16, "int8": np.int8}


class CacheFullError(DayzeroError):
    """No free block for a sequence: the caller preempts (`BlockAllocator.victim`) and retries."""


@dataclass(frozen=True)
class LayerPools:
    """One layer's two pools per token: [heads, key_width] and [heads, value_width] (latent
    attention: heads 1, the latent's and the rotary key's widths)."""
    heads: int
    key_width: int
    value_width: int


@dataclass(frozen=True)
class CacheLayout:
    """The pool's geometry: `layers` layers of `kv_heads` heads of `head_size` for keys and
    values alike, unless `pools` gives each layer its own shapes."""
    layers: int
    kv_heads: int
    head_size: int
    block_size: int = 16
    dtype: str = "f32"
    pools: tuple[LayerPools, ...] = ()

    def __post_init__(self) -> None:
        for name in ("layers", "kv_heads", "head_size", "block_size"):
            _positive(getattr(self, name), name)
        for entry in self.pools:
            for name in ("heads", "key_width", "value_width"):
                _positive(getattr(entry, name), f"layers.{name}")
        if self.pools and len(self.pools) != self.layers:
            raise InputError(f"{len(self.pools)} layer pools for {self.layers} layers",
                             "generation.layers", "give one entry per layer")
        if self.dtype not in _ITEMSIZE:
            raise InputError(f"kv cache dtype {self.dtype!r} is not one of "
                             f"{', '.join(_ITEMSIZE)}", "precision.kv_cache_dtype",
                             "use f32, f16 or int8")

    @property
    def layer_pools(self) -> tuple[LayerPools, ...]:
        return self.pools or (LayerPools(self.kv_heads, self.head_size, self.head_size),
                              ) * self.layers

    @property
    def token_bytes(self) -> int:
        """Bytes one token takes over every layer, both pools (int8: with its scales)."""
        item, scale = _ITEMSIZE[self.dtype], 4 if self.dtype == "int8" else 0
        return sum(p.heads * ((p.key_width + p.value_width) * item + 2 * scale)
                   for p in self.layer_pools)

    @property
    def block_bytes(self) -> int:
        """Bytes of one block over every layer, keys and values (int8: with its scales)."""
        return self.block_size * self.token_bytes

    def blocks_for(self, memory_bytes: int) -> int:
        """How many blocks `memory_bytes` holds; at least one, or an error saying how much one
        block needs."""
        blocks = int(memory_bytes) // self.block_bytes
        if blocks < 1:
            raise InputError(f"kv_cache_memory of {memory_bytes} bytes holds no block of "
                             f"{self.block_bytes} bytes ({self.block_size} tokens)",
                             "generation.kv_cache_memory",
                             f"give at least {self.block_bytes} bytes, or a smaller block_size")
        return blocks


@dataclass
class BlockAllocator:
    """Which blocks belong to which sequence. Free blocks are reused most recent first; when
    none is left, a cached block nobody holds is evicted, least recently used first. With
    prefix caching (the scheduler's `commit` and `grow(..., reuse=...)`), a full block is
    named by its prefix's digest (prefix_cache.py) and may sit in several tables at once:
    `refs` counts them, and a cached block whose last holder lets go stays cached (evictable)
    rather than free. `prefix_queries` and `prefix_hits` count the prompt tokens looked up
    at admission and those found cached (the serving metrics read them)."""
    num_blocks: int
    block_size: int
    free: list[int] = field(default_factory=list)
    tables: dict[object, list[int]] = field(default_factory=dict)
    lengths: dict[object, int] = field(default_factory=dict)
    refs: list[int] = field(default_factory=list)
    cache: PrefixCache = field(default_factory=PrefixCache)
    committed: dict[object, int] = field(default_factory=dict)  # blocks named, per sequence
    prefix_queries: int = 0
    prefix_hits: int = 0

    def __post_init__(self) -> None:
        self.free = list(range(self.num_blocks - 1, -1, -1))  # pop() hands out 0, 1, 2, ...
        self.refs = [0] * self.num_blocks

    def blocks_needed(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    @property
    def available(self) -> int:
        """Blocks a sequence may take: the free ones and the evictable cached ones."""
        return len(self.free) + len(self.cache.evictable)

    def fits(self, seq: object, length: int, reuse: Sequence[int] = ()) -> bool:
        """Whether `seq` can grow to `length` tokens without preempting anyone (a new
        sequence first taking the cached blocks `reuse`)."""
        have = len(self.tables.get(seq, ())) + len(reuse)
        claimed = sum(1 for block in reuse if self.refs[block] == 0)  # leave the evictable
        return self.blocks_needed(length) - have <= self.available - claimed

    def grow(self, seq: object, length: int, reuse: Sequence[int] = ()) -> list[int]:
        """Give `seq` blocks for `length` tokens (admitting it if new: its table starts with
        the cached blocks `reuse`, `match`'s, shared); its block table."""
        table = self.tables.get(seq, [])
        more = self.blocks_needed(length) - len(table) - len(reuse)
        if not self.fits(seq, length, reuse):
            raise CacheFullError(
                f"sequence {seq!r} needs {more} more block(s) of {self.block_size} tokens for "
                f"{length} tokens; {self.available} of {self.num_blocks} are free",
                "kv cache", "preempt a sequence (the newest) and retry, or give the cache "
                "more memory (generation.kv_cache_memory)")
        if reuse:
            for block in reuse:
                self.refs[block] += 1
                self.cache.claim(block)
            table.extend(reuse)
            self.committed[seq] = len(reuse)
        # in place: a decode step grows each member's table by at most a block, at O(1)
        table.extend(self._take() for _ in range(max(more, 0)))
        self.tables[seq] = table
        self.lengths[seq] = max(length, self.lengths.get(seq, 0))
        return table

    def _take(self) -> int:
        block = self.free.pop() if self.free else self.cache.evict()
        self.refs[block] = 1
        return block

    def match(self, digests: Sequence[bytes]) -> list[int]:
        """The cached blocks of the longest prefix of the chain `digests` (prefix_cache.py)."""
        return self.cache.match(digests)

    def commit(self, seq: object, digests: Sequence[bytes], full: int) -> None:
        """Name `seq`'s first `full` blocks (full, their keys and values written by a step
        that has run) by `digests`, so later sequences can reuse them; blocks named before
        are skipped, so a step costs the blocks it filled."""
        table = self.tables.get(seq)
        if table is None:  # released (cancelled) meanwhile: nothing of it to keep
            return
        for index in range(self.committed.get(seq, 0), full):
            self.cache.register(table[index], digests[index])
        self.committed[seq] = full

    def release(self, seq: object) -> None:
        """Let go of every block of `seq` (it finished, was cancelled or is preempted): a
        cached one nobody else holds becomes evictable (its last block first, so a prefix is
        evicted from its end), any other is free."""
        for block in reversed(self.tables.pop(seq, [])):
            self.refs[block] -= 1
            if not self.refs[block] and not self.cache.park(block):
                self.free.append(block)
        self.lengths.pop(seq, None)
        self.committed.pop(seq, None)

    def victim(self) -> object | None:
        """The sequence to preempt when the pool runs dry: the most recently admitted."""
        return next(reversed(self.tables), None)

    @property
    def used(self) -> int:
        """Blocks some sequence holds (cached blocks nobody holds are not counted)."""
        return self.num_blocks - self.available

    @property
    def cached_blocks(self) -> int:
        """Blocks named by a prefix digest, held or evictable."""
        return len(self.cache)


def _positive(value, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InputError(f"{name}={value!r} is not a positive integer",
                         f"generation.{name}", f"set {name} to an integer >= 1")


class PagedKVCache:
    """The pool's data: two pools per layer (keys and values, or latent and rotary key),
    addressed through a block table."""

    def __init__(self, layout: CacheLayout, num_blocks: int):
        self.layout = layout
        self.dtype = np.dtype(_NUMPY[layout.dtype])
        size = layout.block_size
        # [layer][which] -> [blocks, block_size, heads, width]; int8 scales [.., heads]
        self.data = [tuple(np.zeros((num_blocks, size, p.heads, width), self.dtype)
                           for width in (p.key_width, p.value_width))
                     for p in layout.layer_pools]
        self.scales = ([tuple(np.zeros((num_blocks, size, p.heads), np.float32)
                              for _ in range(2)) for p in layout.layer_pools]
                       if layout.dtype == "int8" else None)
        # the [slots, heads, width] views every step stores into (made once: a reshape per
        # layer and step was a tenth of a decode step's Python time)
        self._flat = [tuple(pool.reshape(-1, *pool.shape[-2:]) for pool in pair)
                      for pair in self.data]

    def write(self, layer: int, table: list[int], start: int, keys: np.ndarray,
              values: np.ndarray) -> None:
        """Store tokens start .. start + len(keys) - 1 ([tokens, heads, width] each)."""
        blocks, offsets = self._slots(table, start, len(keys))
        self.store(layer, blocks * self.layout.block_size + offsets, keys, values, start)

    def store(self, layer: int, slots: np.ndarray, keys: np.ndarray, values: np.ndarray,
              first_token: int = 0) -> None:
        """Store one row of keys and values per pool slot (block * block_size + offset); int8
        rows are quantized per token and head with scale max |x| / 127."""
        for which, data in enumerate((keys, values)):
            store = self.flat(layer, which)
            if self.scales is None:
                if len(slots) == 1:  # a decode step's token: a plain index, no gather machinery
                    store[int(slots[0])] = data[0]
                else:
                    store[slots] = data
                continue
            if not np.isfinite(data).all():
                token = int(np.argwhere(~np.isfinite(data))[0][0]) + first_token
                raise InputError(f"layer {layer}'s {('keys', 'values')[which]} hold a NaN or "
                                 f"Inf at token {token}, which an int8 cache cannot store",
                                 "precision.kv_cache_dtype",
                                 "use kv_cache_dtype fp32 to keep non-finite values")
            scale = np.abs(data).max(axis=-1) / 127.0
            safe = np.where(scale > 0, scale, 1.0)[..., None]
            store[slots] = np.rint(data / safe).astype(np.int8)
            self.flat_scales(layer, which)[slots] = scale

    def flat(self, layer: int, which: int) -> np.ndarray:
        """Layer `layer`'s keys (which 0) or values (1) as [slots, heads, width], a view."""
        return self._flat[layer][which]

    def flat_scales(self, layer: int, which: int) -> np.ndarray:
        """The int8 scales of `flat(layer, which)` as [slots, heads], a view."""
        scales = self.scales[layer][which]
        return scales.reshape(-1, scales.shape[-1])

    def read(self, layer: int, table: list[int], length: int) -> tuple[np.ndarray, np.ndarray]:
        """Tokens 0 .. length - 1 as contiguous float32 [length, heads, width] arrays."""
        slots = self._slots(table, 0, length)
        out = []
        for which, store in enumerate(self.data[layer]):
            data = store[slots[0], slots[1]].astype(np.float32)
            if self.scales is not None:
                data *= self.scales[layer][which][slots[0], slots[1]][..., None]
            out.append(data)
        return out[0], out[1]

    def _slots(self, table: list[int], start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        positions = np.arange(start, start + count)
        size = self.layout.block_size
        if count and positions[-1] // size >= len(table):
            raise InputError(f"tokens up to {positions[-1]} need {positions[-1] // size + 1} "
                             f"blocks; the table has {len(table)}", "kv cache",
                             "grow the sequence (BlockAllocator.grow) before writing")
        return np.asarray(table, np.int64)[positions // size], positions % size
