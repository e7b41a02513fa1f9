"""One generation step's inputs: the packed tokens of several sequences and where their keys live.

The step graph (passes/derive_generation_step.py) takes a batch of 1 whose sequence axis is the
step's tokens, from any number of sequences. This module turns "sequence s adds these tokens at
positions start .. start + n - 1, its blocks are these" into the graph's index inputs:
`positions`, `token_seq`, `token_len` (keys each token sees: its position + 1), `seq_slots`
(each sequence's keys 0 .. end - 1: a pool slot for the cached ones, -2 - t for this step's
token t, -1 padding) and `logit_indices` (the rows whose logits come back). It also says which
pool slot each new token's key and value go to once the step has run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

NEW_TOKEN = -2  # slot -2 - t is this step's token t (compiler/ir/ops/paged.py)
PADDING = -1


@dataclass(frozen=True)
class StepPart:
    """One sequence's share of a step: `tokens` placed at positions start, start + 1, ...;
    `table` its block table (covering every position up to start + len(tokens) - 1);
    `logits` whether its last token's logits come back; `images` (a vision.ImageRows) the
    image features of the sequence's image tokens, by position."""
    tokens: np.ndarray
    start: int
    table: Sequence[int]
    logits: bool = True
    images: Any = None


@dataclass
class StepInputs:
    feeds: dict[str, np.ndarray]
    write_slots: np.ndarray       # [T] pool slot of each new token's key and value
    logit_parts: list[int]        # index into the parts, per returned logits row


def build_step(parts: Sequence[StepPart], block_size: int) -> StepInputs:
    """The index inputs of a step packing `parts` in order (see the module docstring)."""
    counts = [len(p.tokens) for p in parts]
    longest = max(p.start + n for p, n in zip(parts, counts))
    first = np.cumsum([0, *counts[:-1]])
    positions = np.concatenate([np.arange(p.start, p.start + n) for p, n in zip(parts, counts)])
    token_seq = np.repeat(np.arange(len(parts)), counts)
    seq_slots = np.full((len(parts), longest), PADDING, np.int64)
    for row, (part, n, t0) in enumerate(zip(parts, counts, first)):
        seq_slots[row, :part.start] = _slots(part.table, 0, part.start, block_size)
        seq_slots[row, part.start:part.start + n] = NEW_TOKEN - np.arange(t0, t0 + n)
    write = np.concatenate([_slots(p.table, p.start, n, block_size)
                            for p, n in zip(parts, counts)])
    # at least one row: the graph's logits dim is a size symbol >= 1 (a prompt's first chunks
    # want none; the caller drops rows it did not ask for)
    wanted = [i for i, p in enumerate(parts) if p.logits] or [len(parts) - 1]
    feeds = {
        "input_ids": np.concatenate([np.asarray(p.tokens, np.int64) for p in parts])[None],
        "positions": positions.astype(np.int64),
        "seq_slots": seq_slots,
        "token_seq": token_seq.astype(np.int64),
        "token_len": (positions + 1).astype(np.int64),
        "logit_indices": np.asarray([first[i] + counts[i] - 1 for i in wanted], np.int64),
    }
    return StepInputs(feeds, write, wanted)


def _slots(table: Sequence[int], start: int, count: int, block_size: int) -> np.ndarray:
    positions = np.arange(start, start + count)
    blocks = np.asarray(table, np.int64)[positions // block_size]
    return blocks * block_size + positions % block_size
