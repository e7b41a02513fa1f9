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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compiler.errors import ArtifactError, DayzeroError, InputError

from ..host_memory import available_bytes
from ..kv_cache import CacheLayout, LayerPools
from ..specs import TensorSpec, specs_from_manifest

_MAX_LAYERS = 1 << 12
MAX_CACHE_BYTES = 1 << 50
# the pool's element type -> the IR dtype of the step graph's cache inputs
CACHE_DTYPES = {"f32": "f32", "f16": "f16", "int8": "i8"}
_MAX_WIDTH = 1 << 16
_MAX_TOKENS = 1 << 24
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20,
          "mb": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
          "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}


MAX_BYTES = 1 << 60  # a size past any machine: refused before any arithmetic on it


def parse_bytes(value: Any, key: str) -> int:
    """`2GiB`, `512MiB`, `1.5g` or a plain integer of bytes, as bytes (at most MAX_BYTES)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_BYTES:
        return value
    text = str(value) if isinstance(value, (int, float, str)) else ""
    match = re.fullmatch(r"\s*([0-9]{1,20}(?:\.[0-9]{1,20})?)\s*([A-Za-z]{0,3})\s*", text)
    unit = match and match.group(2).lower()
    if not match or unit not in _UNITS or float(match.group(1)) <= 0:
        raise DayzeroError(f"{key} {_short(value)} is not a size", key,
                           "write a size such as 2GiB, 512MiB or a number of bytes")
    size = int(float(match.group(1)) * _UNITS[unit])
    if not 0 < size <= MAX_BYTES:
        raise DayzeroError(f"{key} {_short(value)} is {size} bytes, not a size in [1, "
                           f"{MAX_BYTES}]", key, "write a size such as 2GiB or 512MiB")
    return size


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


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
        vocab = count("vocab_size", 1 << 31)
        eos = section.get("eos_token_ids")
        if not isinstance(eos, list) or len(eos) > 64 or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in eos):
            raise ArtifactError(f"manifest.json: generation.eos_token_ids is {_short(eos)}, not "
                                f"a list of at most 64 token ids in [0, {vocab - 1}] (the "
                                "vocabulary, generation.vocab_size)",
                                f"{where}: generation.eos_token_ids",
                                "the artifact is corrupted or was edited; recompile it")
        dtype = section.get("kv_cache_dtype", "f32")
        if not isinstance(dtype, str) or dtype not in CACHE_DTYPES:
            raise fail("kv_cache_dtype")
        return cls(tuple(parsed), vocab, count("max_positions", _MAX_TOKENS),
                   tuple(eos), count("kv_cache_memory", MAX_CACHE_BYTES),
                   count("block_size", 1 << 16), count("prefill_chunk", _MAX_TOKENS),
                   count("max_batch_tokens", _MAX_TOKENS), dtype)


def read_generation(section: Any, manifest: Mapping[str, Any],
                    files: Mapping[str, Any]) -> GenerationSpec:
    """The whole `generation` section, checked for form when the manifest is read: the spec
    above, the prefill forward's specs, the tokenizer's files (listed, under tokenizer/)."""
    spec = GenerationSpec.from_manifest(section, "manifest.json")
    forward = section.get("forward")
    if not isinstance(forward, dict):
        raise _field("forward", forward, "an object of inputs and outputs")
    scoped = {"symbols": manifest.get("symbols", {}), **forward}
    for key in ("inputs", "outputs"):
        specs_from_manifest(scoped, key, prefix="generation.forward.")
    names = section.get("tokenizer") or []
    if not isinstance(names, list) or len(names) > 64 or not all(
            isinstance(n, str) and n.startswith("tokenizer/") and n in files for n in names):
        raise _field("tokenizer", names, "a list of files under tokenizer/ listed in files")
    vision = section.get("vision")
    if vision is not None and not isinstance(vision, dict):
        raise _field("vision", vision, "an object")
    return spec


def _field(key: str, value: Any, expected: str) -> ArtifactError:
    return ArtifactError(f"manifest.json: generation.{key} is {_short(value)}, not {expected}",
                         f"manifest.json: generation.{key}",
                         "the artifact is corrupted or was edited; recompile it")


def checked_cache_memory(spec: GenerationSpec, override: int | None) -> int:
    """The pool size to allocate (`override`, else the artifact's), refused when it is more
    than the memory this process can still take: numpy raised MemoryError for 2**50 bytes,
    and a size just under the machine's memory got the process killed as the pool filled."""
    size = override or spec.kv_cache_memory
    free = available_bytes()
    if free is None or size <= free:
        return size
    said = (f"kv_cache_memory={override} ({_gib(override)})" if override else
            f"the artifact's generation.kv_cache_memory, {size} bytes ({_gib(size)}),")
    error = InputError if override else ArtifactError
    raise error(f"{said} is more than the {free} bytes ({_gib(free)}) of memory available "
                "here", "kv_cache_memory" if override else "manifest.json: "
                "generation.kv_cache_memory",
                f"give the KV cache at most {_gib(free)}: `--kv-cache-memory SIZE` (dayzero "
                "generate / serve) or runtime.load(..., kv_cache_memory=SIZE)")


AUTO_CACHE_SHARE = 0.5  # of the memory available after the weights and the activation arena


def auto_cache_memory(spec: GenerationSpec, tokens: int, available: int | None) -> int:
    """The pool a server needs and may take (`--kv-cache-memory auto`): `tokens` (its context
    times its sequences) in whole blocks, rounded up, at most AUTO_CACHE_SHARE of `available`
    bytes (None: not capped) in whole blocks, and at least one block."""
    layout = spec.cache_layout()
    blocks = -(-max(int(tokens), 1) // spec.block_size)
    if available is not None:
        blocks = min(blocks, int(available * AUTO_CACHE_SHARE) // layout.block_bytes)
    return max(blocks, 1) * layout.block_bytes


def _gib(size: int) -> str:
    return f"{size / 2**30:.3g} GiB"


def check_step_graph(spec: GenerationSpec, inputs: Sequence[TensorSpec],
                     outputs: Sequence[TensorSpec], where: str) -> None:
    """The generation settings are the step graph's (whose specs are proven equal to
    graph.dzir's at load): the logits' vocabulary, one key and value output and one cache
    pool pair per layer of the recorded widths and pool dtype, the longest step the graph
    takes. An edited section would otherwise fail at the first step, blamed on the caller, or
    size the pools wrongly."""
    def fail(what: str) -> ArtifactError:
        return ArtifactError(f"the artifact is inconsistent: manifest.json {what}",
                             f"{where}: generation", "recompile the artifact: it was edited or "
                             "corrupted after it was written")

    if len(outputs) != 1 + 2 * len(spec.layers):
        raise fail(f"lists {len(spec.layers)} cache layers (generation.layers), but the step "
                   f"graph has {len(outputs)} outputs, not the logits and a key and value per "
                   "layer")
    vocab = outputs[0].shape[-1] if outputs[0].shape else None
    if vocab != spec.vocab_size:
        raise fail(f"says generation.vocab_size = {spec.vocab_size}, but the step graph's "
                   f"logits {outputs[0]} have {vocab}")
    by_name = {s.name: s for s in inputs}
    pool_dtype = CACHE_DTYPES[spec.kv_cache_dtype]
    for i, layer in enumerate(spec.layers):
        for kind, width, output in (("k", layer.head_size, outputs[1 + 2 * i]),
                                    ("v", layer.value_size, outputs[2 + 2 * i])):
            pool = by_name.get(f"{kind}_cache_{i}")
            want = (layer.kv_heads, width)
            if pool is None or tuple(pool.shape[1:]) != want or pool.dtype != pool_dtype \
                    or tuple(output.shape[1:]) != want:
                raise fail(f"says generation.layers[{i}] caches {want} {pool_dtype} per token, "
                           f"but the step graph has {pool or f'no {kind}_cache_{i}'} and "
                           f"output {output}")
    ids = inputs[0] if inputs else None
    tokens = ids.shape[1] if ids is not None and len(ids.shape) > 1 else None
    hi = ids.ranges.get(tokens, (None, None))[1] if isinstance(tokens, str) else None
    if hi != spec.max_positions:
        raise fail(f"says generation.max_positions = {spec.max_positions}, but the step graph "
                   f"takes {ids} with {tokens} up to {hi}")
