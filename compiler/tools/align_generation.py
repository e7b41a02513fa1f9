"""`dayzero align` on a generation artifact: a prefill step and a decode step, each aligned.

A generation artifact's graph is a KV-cached step whose index inputs (slot lists, positions)
must agree with each other and with the cache, so random inputs would align nonsense. Instead
two real steps are built: the prefill of a short prompt into an empty cache, then the decode of
the token it picked, reading the keys and values the prefill wrote (as the runtime wrote them
from the artifact's own backend). Each is aligned value by value like any artifact.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

PROMPT_TOKENS = 8


def generation_steps(path: str | Path, prompt_tokens: int = PROMPT_TOKENS
                     ) -> list[tuple[str, list[np.ndarray]]]:
    """[(label, inputs in the step graph's order)] for a prefill and a decode step."""
    import runtime
    from runtime.generation.spec import GenerationSpec
    from runtime.generation.step import StepPart, build_step

    manifest = runtime.open_artifact(path, verify="size").manifest
    spec = GenerationSpec.from_manifest(manifest["generation"], str(path))
    layout = spec.cache_layout()
    blocks = -(-(prompt_tokens + 1) // spec.block_size)
    model = runtime.load(path, kv_cache_memory=blocks * layout.block_bytes)
    runner = model.runner
    runner.allocator.grow("align", prompt_tokens + 1)
    table = runner.allocator.tables["align"]
    prompt = np.arange(prompt_tokens, dtype=np.int64) * 7919 % spec.vocab_size
    names = [s.name for s in model.step_model.input_specs]

    def inputs(part: StepPart) -> list[np.ndarray]:
        feeds = {**build_step([part], spec.block_size).feeds,
                 **{k: v.copy() for k, v in runner._pools.items()}}
        return [feeds[n] for n in names]

    prefill = StepPart(prompt, 0, table)
    steps = [(f"prefill step ({prompt_tokens} tokens, empty cache)", inputs(prefill))]
    logits, _ = runner.run([prefill])
    decode = StepPart(np.asarray([int(np.argmax(logits[0]))]), prompt_tokens, table)
    steps.append((f"decode step (1 token after {prompt_tokens} cached)", inputs(decode)))
    return steps
