"""One generation step's inputs: the packed tokens of several sequences and where their keys live.

The step graph (passes/derive_generation_step/) takes a batch of 1 whose sequence axis is the
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
    """The index inputs of a step packing `parts` in order (see the module docstring).

    Runs before every step of a generation loop, so it makes one slot array per part (the
    cached keys' slots and the new tokens' are one range of its block table) and fills
    preallocated arrays rather than concatenating per-part pieces."""
    counts = [len(p.tokens) for p in parts]
    total = sum(counts)
    seq_slots = np.full((len(parts), max(p.start + n for p, n in zip(parts, counts))),
                        PADDING, np.int64)
    positions, token_seq, write = (np.empty(total, np.int64) for _ in range(3))
    input_ids = np.empty((1, total), np.int64)
    first = []
    t0 = 0
    for row, (part, n) in enumerate(zip(parts, counts)):
        start, end = part.start, part.start + n
        slots = _slots(part.table, end, block_size)
        seq_slots[row, :start] = slots[:start]
        seq_slots[row, start:end] = np.arange(NEW_TOKEN - t0, NEW_TOKEN - t0 - n, -1)
        positions[t0:t0 + n] = np.arange(start, end)
        token_seq[t0:t0 + n] = row
        write[t0:t0 + n] = slots[start:]
        input_ids[0, t0:t0 + n] = part.tokens
        first.append(t0)
        t0 += n
    # at least one row: the graph's logits dim is a size symbol >= 1 (a prompt's first chunks
    # want none; the caller drops rows it did not ask for)
    wanted = [i for i, p in enumerate(parts) if p.logits] or [len(parts) - 1]
    feeds = {
        "input_ids": input_ids,
        "positions": positions,
        "seq_slots": seq_slots,
        "token_seq": token_seq,
        "token_len": positions + 1,
        "logit_indices": np.asarray([first[i] + counts[i] - 1 for i in wanted], np.int64),
    }
    return StepInputs(feeds, write, wanted)


def _slots(table: Sequence[int], count: int, block_size: int) -> np.ndarray:
    """The pool slots of positions 0 .. count - 1 under block table `table`."""
    blocks = np.asarray(table[:-(-count // block_size)], np.int64)
    return (blocks[:, None] * block_size + np.arange(block_size)).reshape(-1)[:count]
