"""StepRunner: runs a generation artifact's step graph over a paged KV cache.

It owns the pool (`runtime.kv_cache.PagedKVCache`, sized once from `generation.kv_cache_memory`)
and its books (`BlockAllocator`), feeds each layer's pool to the step as a [slots, kv_heads,
head_size] view (no copy), and after each step writes the new keys and values the step returns
into the slots of their tokens. What to run in a step is the scheduler's business.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compiler.errors import ArtifactError

from ..kv_cache import BlockAllocator, PagedKVCache
from .spec import GenerationSpec
from .step import StepPart, build_step
from .vision import IMAGE_INPUTS, image_feeds


class StepRunner:
    def __init__(self, model, spec: GenerationSpec, kv_cache_memory: int | None = None):
        self.model, self.spec = model, spec
        self.layout = spec.cache_layout()  # each layer's pools as its step inputs read them
        blocks = self.layout.blocks_for(kv_cache_memory or spec.kv_cache_memory)
        self.cache = PagedKVCache(self.layout, blocks)
        self.allocator = BlockAllocator(blocks, spec.block_size)
        self._names = [s.name for s in model.input_specs]
        if len(model.output_specs) != 1 + 2 * len(spec.layers):
            raise ArtifactError(f"the step graph has {len(model.output_specs)} outputs, not the "
                                f"logits and a key and value per layer ({len(spec.layers)})",
                                "outputs", "the artifact is corrupted; recompile it")
        self._pools = {}
        for layer in range(len(spec.layers)):
            for which, name in enumerate("kv"):
                self._pools[f"{name}_cache_{layer}"] = self.cache.flat(layer, which)
                if self.cache.scales is not None:
                    self._pools[f"{name}_scale_{layer}"] = self.cache.flat_scales(layer, which)
        # an image-text step also takes image rows per token (vision.py)
        self.image_width = next((s.shape[-1] for s in model.input_specs
                                 if s.name == "image_embeds"), None)
        missing = [n for n in self._names if n not in self._pools and n not in _STEP_INPUTS]
        if missing:
            raise ArtifactError(f"the step graph takes unknown inputs {missing}", "inputs",
                                "the artifact is corrupted; recompile it")
        # the pools are checked once here; a step validates only its index inputs
        self._step = model.with_fixed_inputs(self._pools)
        self.max_step_tokens = _token_bound(model.input_specs)

    def commit_cache(self) -> None:
        """Touch every page of the pool now. numpy's zeros are pages the system hands out on
        first write, so a pool otherwise grows in memory with the most blocks ever in use at
        once; a server commits it at start so its memory does not grow with load."""
        for pools in (self.cache.data, self.cache.scales or ()):
            for pool in (array for pair in pools for array in pair):
                pool.fill(0)

    @property
    def cache_bytes(self) -> int:
        return self.allocator.num_blocks * self.layout.block_bytes

    def run(self, parts: Sequence[StepPart]) -> tuple[np.ndarray, list[int]]:
        """Run one step; returns the logits rows [n, vocab] and, per row, its part's index."""
        step = build_step(parts, self.spec.block_size)
        feeds = step.feeds
        if self.image_width is not None:
            feeds = {**feeds, **image_feeds(parts, self.image_width)}
        outputs = self.call(feeds)
        # outputs by position (a backend's lowering may rename them): logits, then each
        # layer's new keys and values
        for layer in range(len(self.spec.layers)):
            self.cache.store(layer, step.write_slots, outputs[1 + 2 * layer],
                             outputs[2 + 2 * layer])
        logits = outputs[0]
        return logits.reshape(-1, logits.shape[-1]), step.logit_parts


    def call(self, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        """The step graph's outputs for these index inputs (`build_step`'s feeds; those the
        graph does not take are left out) over the pools."""
        return self._step(**{s.name: feeds[s.name] for s in self._step.free_specs})


def _token_bound(specs) -> int | None:
    """The most tokens one step may pack: the upper end of the compiled range of
    `input_ids`' token dim (None when it is unbounded)."""
    ids = next((s for s in specs if s.name == "input_ids"), None)
    dim = ids.shape[-1] if ids is not None else None
    if isinstance(dim, int):
        return dim
    return ids.ranges.get(dim, (1, None))[1] if dim is not None else None


_STEP_INPUTS = frozenset({"input_ids", "positions", "seq_slots", "token_seq", "token_len",
                          "logit_indices", *IMAGE_INPUTS})
