"""Prompts as `generate` accepts them, checked before any work, and its output assembled.

`input_ids` is one prompt (a 1-D array or list of ids), a batch [batch, len] (with
`attention_mask` marking the real tokens of padded rows, left or right padded, as a tokenizer
pads them), or a list of prompts of different lengths. The output is transformers' layout:
each row is its prompt as given (a list's prompts left-padded to one length), then the new
tokens, rows that stopped early padded to the longest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.errors import InputError

from ..to_numpy import to_numpy
from .spec import GenerationSpec


@dataclass
class Prompts:
    rows: list[np.ndarray]          # each prompt's real tokens
    given: np.ndarray | None        # [batch, len] as the caller gave it (padding included)
    single: bool

    @classmethod
    def from_ids(cls, input_ids: Any, attention_mask: Any, spec: GenerationSpec) -> Prompts:
        single, given = False, None
        if isinstance(input_ids, (list, tuple)) and input_ids and not np.isscalar(input_ids[0]):
            rows = [_ids(row, f"input_ids[{i}]") for i, row in enumerate(input_ids)]
        else:
            ids = _ids(input_ids, "input_ids", ranks=(1, 2))
            single = ids.ndim == 1 or ids.shape[0] == 1
            given = ids.reshape(1, -1) if ids.ndim == 1 else ids
            rows = _unpad(given, attention_mask)
        if not rows:
            raise InputError("no prompt given", "input_ids", "pass at least one prompt")
        for i, row in enumerate(rows):
            where = f"input_ids[{i}]"
            if len(row) == 0:
                raise InputError("a prompt has no tokens", where, "give every prompt a token")
            bad = (row < 0) | (row >= spec.vocab_size)
            if bad.any():
                raise InputError(f"token id {int(row[bad][0])} is outside the vocabulary "
                                 f"[0, {spec.vocab_size})", where,
                                 "tokenize with this model's tokenizer")
        return cls(rows, given, single)

    def assemble(self, generated: list[list[int]], pad: int | None) -> np.ndarray:
        pad = 0 if pad is None else int(pad)
        prompts = self.given if self.given is not None else _left_pad(self.rows, pad)
        new = max((len(g) for g in generated), default=0)
        tail = np.full((len(generated), new), pad, np.int64)
        for row, tokens in enumerate(generated):
            tail[row, :len(tokens)] = tokens
        return np.concatenate([prompts.astype(np.int64), tail], axis=1)


def check_request(prompts: Prompts, max_new_tokens: Any, spec: GenerationSpec, runner) -> None:
    """Everything that would fail later, refused now with one message."""
    if not isinstance(max_new_tokens, (int, np.integer)) or isinstance(max_new_tokens, bool) \
            or max_new_tokens <= 0:
        raise InputError(f"max_new_tokens={max_new_tokens!r} is not a positive integer",
                         "max_new_tokens", "ask for at least one new token")
    longest = max(len(r) for r in prompts.rows)
    if longest + max_new_tokens > spec.max_positions:
        raise InputError(f"a prompt of {longest} tokens plus {max_new_tokens} new ones exceeds "
                         f"the {spec.max_positions} positions the model was compiled for",
                         "input_ids", "shorten the prompt, ask for fewer tokens, or recompile "
                         "with a longer sequence range")
    allocator = runner.allocator
    need = allocator.blocks_needed(longest + max_new_tokens)
    if need > allocator.num_blocks:
        raise InputError(f"the KV cache holds {allocator.num_blocks * allocator.block_size} "
                         f"tokens ({allocator.num_blocks} blocks), less than one sequence of "
                         f"{longest + max_new_tokens}", "generation.kv_cache_memory",
                         "give the cache more memory (load(..., kv_cache_memory=...) or the "
                         "generation.kv_cache_memory config), or ask for fewer tokens")


def _ids(value: Any, where: str, ranks: tuple[int, ...] = (1,)) -> np.ndarray:
    array = np.asarray(to_numpy(value))
    if array.ndim not in ranks or array.dtype.kind not in "iu":
        raise InputError(f"{where} is {array.dtype}[{', '.join(map(str, array.shape))}], not "
                         f"integer token ids of rank {' or '.join(map(str, ranks))}", where,
                         "pass token ids as integers")
    return array.astype(np.int64)


def _unpad(ids: np.ndarray, attention_mask: Any) -> list[np.ndarray]:
    if attention_mask is None:
        return list(ids)
    mask = np.asarray(to_numpy(attention_mask))
    if mask.shape != ids.shape:
        raise InputError(f"attention_mask {list(mask.shape)} does not match input_ids "
                         f"{list(ids.shape)}", "attention_mask", "pass one mask entry per token")
    rows = []
    for i, (row, keep) in enumerate(zip(ids, mask.astype(bool))):
        real = np.flatnonzero(keep)
        if len(real) and real[-1] - real[0] + 1 != len(real):
            raise InputError(f"attention_mask row {i} has holes: only left or right padding "
                             "is supported", "attention_mask", "pad prompts on one side")
        rows.append(row[keep])
    return rows


def _left_pad(rows: list[np.ndarray], pad: int) -> np.ndarray:
    width = max(len(r) for r in rows)
    out = np.full((len(rows), width), pad, np.int64)
    for i, row in enumerate(rows):
        out[i, width - len(row):] = row
    return out
