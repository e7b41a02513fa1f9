"""Day-0 checkpoint loading: a Hugging Face checkpoint folder compiled in bounded memory.

    ckpt = open_checkpoint("path/to/checkpoint/")    # headers, config, meta model, name check
    compiler.compile(ckpt.module, ckpt.example_inputs, out="m.dz",
                     dynamic_shapes=ckpt.dynamic_shapes, checkpoint=ckpt)
    # or in one call:
    compile_checkpoint("path/to/checkpoint/", out="m.dz", config={"precision": {...}})

Stages, one module each: `layout` (config.json, index, shard headers, all checked), `build`
(the transformers model on the meta device, example token ids), `verify` (names, shapes and
dtypes against the model, every mismatch in one error), `conversion` (parameters transformers
assembles on load, per-expert MoE tensors stacked, found with its own conversion mapping),
`lazy` and `lazy_converted` (handles that stream a tensor from its shard's mmap, chunk by chunk,
or a stack of them), `precision` (dtype conversion with overflow checks), `bind`
(the exported graph's weights pointed at the handles; progress and summary of the write).
transformers is imported only when a checkpoint is opened.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .bind import Checkpoint
from .layout import (
    CheckpointError,
    CheckpointLayout,
    TensorRecord,
    read_layout,
)
from .lazy import LazyConcat, LazyTensor, ShardReader, StreamStats, concat_rows

__all__ = ["Checkpoint", "CheckpointError", "CheckpointLayout", "LazyConcat", "LazyTensor",
           "ShardReader", "StreamStats", "TensorRecord", "compile_checkpoint", "concat_rows",
           "open_checkpoint", "parse_seq_range", "read_layout"]


def open_checkpoint(path: str | Path, seq_range: tuple[int, int] | None = None,
                    batch: int = 1) -> Checkpoint:
    """Read a checkpoint folder's headers, build its model on meta and check every name.

    Raises CheckpointError for a broken folder (missing shard, bad header, unknown config) and
    one CheckpointError listing every name/shape/dtype mismatch. Reads no tensor data.
    `seq_range` (min, max) bounds the dynamic sequence length of the `input_ids` input.
    """
    from .build import build_model
    from .verify import match

    layout = read_layout(path)
    built = build_model(layout, seq_range=seq_range, batch=batch)
    binding = match(layout, built.tensors, built.architecture)
    return Checkpoint(layout, built, binding, ShardReader(layout))


def compile_checkpoint(path: str | Path, out: str | Path = "model.dz",
                       backend: str = "onnxruntime", config: Any = None,
                       seq_range: tuple[int, int] | None = None, **options: Any) -> Path:
    """Compile a checkpoint folder into an artifact; `options` go to `compiler.compile`."""
    from compiler.driver import compile

    ckpt = open_checkpoint(path, seq_range=seq_range)
    return compile(ckpt.module, ckpt.example_inputs, out=out, backend=backend,
                   dynamic_shapes=ckpt.dynamic_shapes, config=config, checkpoint=ckpt, **options)


def parse_seq_range(text: str) -> tuple[int, int]:
    """`MIN:MAX` (or a single length N, meaning a static N) as used by `--seq-len`."""
    lo, sep, hi = text.partition(":")
    try:
        values = (int(lo), int(hi)) if sep else (int(lo), int(lo))
    except ValueError:
        raise CheckpointError(f"--seq-len '{text}' is not MIN:MAX or N", "--seq-len",
                              "write e.g. --seq-len 2:2048") from None
    if not 1 <= values[0] <= values[1]:
        raise CheckpointError(f"--seq-len '{text}' is an empty range", "--seq-len",
                              "give 1 <= MIN <= MAX")
    return values
