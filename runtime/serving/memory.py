"""The served model loaded with a KV cache sized for what it serves (`--kv-cache-memory auto`).

A compiled artifact's own cache size (2 GiB by default) knows nothing of the model or the
machine: a 0.5 MB model held 2.2 GB. A server knows what it needs: `--max-model-len` tokens
for each of `--max-num-seqs` sequences, in whole blocks. It takes that, capped at half the
memory available after the weights and the activation arena (cgroup-aware: host_memory.py),
so that a big context times many sequences fits the machine instead of failing it.

The arena is measured, not guessed: the model is loaded with a pool just large enough for one
full step, that step is run (the backend's arena grows to its largest, as the engine's warm-up
makes it), the available memory is read, and the model is made again over the same loaded
step graph with the pool sized. A tensor-parallel artifact's ranks allocate their shares as
they start, so there the size is set before loading, from the memory available less the
artifact's files. An explicit size is taken as given, and refused with the numbers when it is
more than the memory available (runtime/generation/spec.py `checked_cache_memory`).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

from compiler.errors import DayzeroError

from .. import host_memory
from ..generation.scheduler import Scheduler, Sequence
from ..generation.spec import AUTO_CACHE_SHARE, GenerationSpec, auto_cache_memory
from ..manifest import read_manifest

log = logging.getLogger("dayzero.serve")
DEFAULT_MAX_NUM_SEQS = 256  # vLLM's default


def load_served(path: str | Path, kv_cache_memory: str | None = "auto",
                max_model_len: int | None = None, max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
                session=None, max_batch_tokens: int | None = None):
    """(model, context): the artifact at `path` loaded for serving, its KV cache
    `kv_cache_memory` ("auto" or None: sized here; else bytes or "512MiB"), and the context it
    serves (`max_model_len`, checked against the artifact's positions; None for a model that
    does not generate)."""
    import runtime
    from runtime.distributed import partitioned_world

    auto = kv_cache_memory in (None, "auto")
    if not auto:
        model = runtime.load(path, kv_cache_memory=kv_cache_memory, session=session)
        return model, _context(model, max_model_len)
    spec = _spec(Path(path))
    if spec is None:  # not a generation artifact: the caller says so
        return runtime.load(path, session=session), None
    context = served_context(spec, max_model_len)
    if partitioned_world(path) > 1:
        free = host_memory.available_bytes()
        free = None if free is None else max(free - _files_bytes(Path(path)), 0)
        size = _sized(spec, context, max_num_seqs, free)
        return runtime.load(path, kv_cache_memory=size, session=session), context
    model = runtime.load(path, kv_cache_memory=_probe_bytes(spec, max_batch_tokens),
                         session=session)
    _full_step(model, max_batch_tokens)
    free = host_memory.available_bytes()  # after the weights and the arena
    # the probe's pool is let go once the model is made again
    free = None if free is None else free + model.runner.cache_bytes
    size = _sized(model.spec, context, max_num_seqs, free)
    # made again over the same loaded step graph, with its settings (prefix caching, if any)
    settings = {"prefix_cache": model.prefix_cache} if hasattr(model, "prefix_cache") else {}
    return type(model)(model.step_model, kv_cache_memory=size, **settings), context


def served_context(spec: GenerationSpec, max_model_len: int | None) -> int:
    """The context served: `max_model_len`, at most the artifact's positions (its default)."""
    if max_model_len is None:
        return spec.max_positions
    if not 2 <= max_model_len <= spec.max_positions:
        raise DayzeroError(f"--max-model-len {max_model_len} is not in [2, "
                           f"{spec.max_positions}]: the artifact was compiled for "
                           f"{spec.max_positions} positions", "--max-model-len",
                           f"pass at most {spec.max_positions}, or recompile with a longer "
                           "--seq-len")
    return max_model_len


def _context(model, max_model_len: int | None) -> int | None:
    spec = getattr(model, "spec", None)
    return None if not isinstance(spec, GenerationSpec) else served_context(spec, max_model_len)


def _spec(path: Path) -> GenerationSpec | None:
    section = read_manifest(path).raw.get("generation")
    return None if section is None else GenerationSpec.from_manifest(section, str(path))


def _sized(spec: GenerationSpec, context: int, seqs: int, free: int | None) -> int:
    size = auto_cache_memory(spec, context * seqs, free)
    tokens = size // spec.cache_layout().block_bytes * spec.block_size
    capped = f"half of the {free / 2**20:.0f} MiB available" if free is not None else "nothing"
    log.info("KV cache: %d tokens (%.1f MiB) for %d sequences of %d tokens, capped at %s",
             tokens, size / 2**20, seqs, context, capped)
    if tokens < context:
        log.warning("the KV cache holds %d tokens, less than one context of %d: %.0f%% of the "
                    "available memory is all it may take; pass a smaller --max-model-len",
                    tokens, context, AUTO_CACHE_SHARE * 100)
    return size


def _probe_bytes(spec: GenerationSpec, max_batch_tokens: int | None) -> int:
    """A pool that holds one full step of `_full_step`'s prompts."""
    budget = max_batch_tokens or spec.max_batch_tokens
    length = max(1, min(spec.prefill_chunk, budget, spec.max_positions - 1))
    blocks = math.ceil(budget / length) * math.ceil(length / spec.block_size)
    return blocks * spec.cache_layout().block_bytes


def _full_step(model, max_batch_tokens: int | None) -> None:
    """One step as large as the token budget: the backend's arena at its largest."""
    scheduler = Scheduler(model.runner, max_batch_tokens)
    pool = scheduler.allocator.num_blocks * scheduler.allocator.block_size
    length = max(1, min(scheduler.chunk, model.spec.max_positions - 1, pool - 1))
    fit = scheduler.allocator.num_blocks // scheduler.allocator.blocks_needed(length)
    for _ in range(max(1, min(-(-scheduler.budget // length), fit))):
        scheduler.add(Sequence([0] * length, 1))
    for _ in scheduler.run():
        pass


def _files_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
