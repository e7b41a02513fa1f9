"""`dayzero inspect --memory` on a generation artifact: weights, KV cache and activations apart.

A generation run holds three kinds of memory that grow with different things: the weights (the
model), the KV cache (the `generation.kv_cache_memory` pool: tokens in flight across all
sequences) and the activations of one step (the step's token budget, `max_batch_tokens`,
planned by the memory planner at that size). Each is sized here from the manifest and the
step graph.
"""

from __future__ import annotations

from typing import Any

from compiler.ir import Graph
from compiler.ir.symbolic import product


def step_sizes(manifest: dict[str, Any], graph: Graph) -> dict[str, int]:
    """Symbol values of the largest step: the token budget, each token its own sequence (the
    most sequences), the longest key list the positions allow, the pool as compiled."""
    from runtime.generation.spec import GenerationSpec

    spec = GenerationSpec.from_manifest(manifest["generation"], "manifest.json")
    tokens = graph.inputs[0].shape[1]
    budget = min(spec.max_batch_tokens, graph.symbols[str(tokens)][1] or spec.max_batch_tokens)
    return {str(tokens): budget, "step_seqs": budget, "step_logits": budget,
            "step_keys": spec.max_positions, "kv_slots": _pool(spec)[1]}


def _pool(spec) -> tuple[int, int]:
    """(bytes, token slots) of the KV pool the runtime allocates for this spec."""

    layout = spec.cache_layout()
    blocks = layout.blocks_for(spec.kv_cache_memory)
    return blocks * layout.block_bytes, blocks * spec.block_size


def memory_by_kind(manifest: dict[str, Any], graph: Graph, activation_bytes: int) -> str:
    from runtime.generation.spec import GenerationSpec

    spec = GenerationSpec.from_manifest(manifest["generation"], "manifest.json")
    weights = sum(product(v.type.shape) * v.type.dtype.itemsize for v in graph.weights.values())
    pool, slots = _pool(spec)
    per_token = pool // max(slots, 1)
    sizes = step_sizes(manifest, graph)
    lines = [
        "generation artifact: memory by kind",
        f"  weights       {_mib(weights)}",
        f"  KV cache      {_mib(pool)}  ({slots} tokens across sequences, {per_token} B a token "
        f"over {len(spec.layers)} layers; generation.kv_cache_memory)",
        f"  activations   {_mib(activation_bytes)}  (one step of "
        f"{sizes[str(graph.inputs[0].shape[1])]} tokens; generation.max_batch_tokens)",
        f"  total         {_mib(weights + pool + activation_bytes)}",
    ]
    return "\n".join(lines) + "\n"


def _mib(n: int) -> str:
    return f"{n / 2**20:10.2f} MiB"
