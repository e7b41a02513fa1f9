"""Text generation on a generation artifact: the paged KV cache driven step by step.

`spec` reads the manifest's `generation` section, `step` builds a packed step's index inputs,
`engine` runs the step graph over the pool, `scheduler` packs sequences into steps (continuous
batching, preemption), `prompts` checks what `generate` is given, and `model` is the
`GenerationModel` that `runtime.load` returns for such an artifact.
"""
