"""The `generation` section of a generation artifact's manifest, read as untrusted data.

The compiler records what the runtime needs to drive the step graph: the cache geometry per
layer (KV heads, head sizes, sliding window; a latent-attention layer caches its compressed
latent and shared rotary key instead, entry `[1, kv_lora_rank, rope_dim, window, "latent"]`),
the vocabulary, the longest sequence the model was exported for, the end-of-sequence ids, and
the cache settings of the `generation:` config (memory, block size, prefill chunk, token budget
per step). Every field is checked here, with
bounds, before the runtime allocates anything from it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from compiler.errors import ArtifactError, DayzeroError

from ..kv_cache import CacheLayout, LayerPools

_MAX_LAYERS = 1 << 12
_MAX_WIDTH = 1 << 16
_MAX_TOKENS = 1 << 24
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20,
          "mb": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
          "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}


def parse_bytes(value: Any, key: str) -> int:
    """`2GiB`, `512MiB`, `1.5g` or a plain integer of bytes, as bytes."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(value))
    unit = match and match.group(2).lower()
    if not match or unit not in _UNITS or float(match.group(1)) <= 0:
        raise DayzeroError(f"{key} {value!r} is not a size", key,
                           "write a size such as 2GiB, 512MiB or a number of bytes")
    return int(float(match.group(1)) * _UNITS[unit])


# what a layer's two pools hold per token: "attention" keys and values of kv_heads heads;
# "latent" (DeepSeek's MLA) the normalized latent (head_size wide) and the rotated shared key
# (value_size wide), one head each
LAYER_KINDS = ("attention", "latent")


@dataclass(frozen=True)
class LayerCache:
    kv_heads: int
    head_size: int
    value_size: int
    window: int | None
    kind: str = "attention"

    def to_manifest(self) -> list:
        entry = [self.kv_heads, self.head_size, self.value_size, self.window]
        return entry if self.kind == "attention" else [*entry, self.kind]


@dataclass(frozen=True)
class GenerationSpec:
    layers: tuple[LayerCache, ...]
    vocab_size: int
    max_positions: int
    eos_token_ids: tuple[int, ...]
    kv_cache_memory: int
    block_size: int
    prefill_chunk: int
    max_batch_tokens: int
    kv_cache_dtype: str = "f32"

    def to_manifest(self) -> dict[str, Any]:
        return {"layers": [c.to_manifest() for c in self.layers],
                "vocab_size": self.vocab_size, "max_positions": self.max_positions,
                "eos_token_ids": list(self.eos_token_ids),
                "kv_cache_memory": self.kv_cache_memory, "block_size": self.block_size,
                "prefill_chunk": self.prefill_chunk, "max_batch_tokens": self.max_batch_tokens,
                "kv_cache_dtype": self.kv_cache_dtype}

    def cache_layout(self) -> CacheLayout:
        """The paged pool's geometry: each layer's two pools as the step graph reads them."""
        first = self.layers[0]
        return CacheLayout(len(self.layers), first.kv_heads, first.head_size, self.block_size,
                           self.kv_cache_dtype,
                           tuple(LayerPools(c.kv_heads, c.head_size, c.value_size)
                                 for c in self.layers))

    @classmethod
    def from_manifest(cls, section: Any, where: str) -> GenerationSpec:
        def fail(key: str) -> ArtifactError:
            return ArtifactError(f"manifest.json: generation.{key} is missing or invalid",
                                 f"{where}: generation.{key}", "the artifact is corrupted; "
                                 "recompile it")

        def count(key: str, top: int, value: Any = None) -> int:
            value = section.get(key) if value is None else value
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= top:
                raise fail(key)
            return value

        if not isinstance(section, dict):
            raise fail("(section)")
        layers = section.get("layers")
        if not isinstance(layers, list) or not 1 <= len(layers) <= _MAX_LAYERS:
            raise fail("layers")
        parsed = []
        for entry in layers:
            if not isinstance(entry, list) or len(entry) not in (4, 5) \
                    or (len(entry) == 5 and entry[4] not in LAYER_KINDS[1:]):
                raise fail("layers")
            heads, size, vsize = (count("layers", _MAX_WIDTH, v) for v in entry[:3])
            window = None if entry[3] is None else count("layers", _MAX_TOKENS, entry[3])
            parsed.append(LayerCache(heads, size, vsize, window, *entry[4:]))
        eos = section.get("eos_token_ids")
        if not isinstance(eos, list) or len(eos) > 64 or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in eos):
            raise fail("eos_token_ids")
        dtype = section.get("kv_cache_dtype", "f32")
        if dtype not in ("f32", "f16", "int8"):
            raise fail("kv_cache_dtype")
        return cls(tuple(parsed), count("vocab_size", 1 << 31), count("max_positions", _MAX_TOKENS),
                   tuple(eos), count("kv_cache_memory", 1 << 50), count("block_size", 1 << 16),
                   count("prefill_chunk", _MAX_TOKENS), count("max_batch_tokens", _MAX_TOKENS),
                   dtype)
