"""The logit processors themselves: what each does to a batch of rows, and what it keeps of
each sequence (runtime/logit_processors.py builds them from a generation config, in
transformers' order, and says why the numbers are transformers'; and the OpenAI / vLLM request
penalties, `OccurrencePenalty`, in vLLM's numbers).

Each processor changes `scores` [rows, vocab] float32 in place, row i for `histories[i]`. The
tables a sequence keeps (the distinct ids a repetition penalty looks at, the n-grams) are
extended with the tokens added since the last step, never rebuilt: a step costs O(its rows).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


# -- what the processors see of a sequence -----------------------------------------------------
@dataclass(eq=False)
class History:
    """One sequence as its processors see it: its tokens (prompt, then generated: the caller's
    list, appended to in place), where its prompt ends, how many tokens it may add; and the
    tables the processors keep, by processor, extended with the tokens added since."""
    tokens: list[int]
    prompt_len: int
    max_new_tokens: int
    tables: dict[Any, Any] = field(default_factory=dict, repr=False)

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len


class _Seen:
    """The distinct ids of a sequence, in first-seen order, as a growing int64 array."""

    def __init__(self) -> None:
        self.set: set[int] = set()
        self.ids = np.empty(16, np.int64)
        self.count = self.done = 0

    def extend(self, tokens: list[int]) -> None:
        for token in tokens[self.done:]:
            token = int(token)
            if token not in self.set:
                self.set.add(token)
                if self.count == len(self.ids):
                    self.ids = np.concatenate([self.ids, np.empty_like(self.ids)])
                self.ids[self.count] = token
                self.count += 1
        self.done = len(tokens)


class _Counts:
    """How often each id occurs among a sequence's GENERATED tokens (not its prompt), as two
    growing arrays (ids in first-seen order, their counts): a new token costs O(1)."""

    def __init__(self) -> None:
        self.index: dict[int, int] = {}
        self.ids = np.empty(16, np.int64)
        self.counts = np.zeros(16, np.float32)
        self.done = -1  # tokens looked at (-1: none yet, the prompt is skipped at first)

    def extend(self, tokens: list[int], prompt_len: int) -> None:
        for token in tokens[max(self.done, prompt_len):]:
            token = int(token)
            at = self.index.get(token)
            if at is None:
                at = self.index[token] = len(self.index)
                if at == len(self.ids):
                    self.ids = np.concatenate([self.ids, np.empty_like(self.ids)])
                    self.counts = np.concatenate([self.counts, np.zeros_like(self.counts)])
                self.ids[at] = token
            self.counts[at] += 1  # exact in float32 up to 2**24 occurrences
        self.done = len(tokens)

    @property
    def size(self) -> int:
        return len(self.index)


class _NGrams:
    """A sequence's n-grams by their first n - 1 tokens: the prefix's hash -> [(where the
    prefix first occurs, the tokens seen after it)]. A prefix is kept as a position, not a
    tuple, so memory is O(length) for any n; a lookup compares the prefix it finds."""

    def __init__(self, n: int) -> None:
        self.n, self.done = n, 0
        self.by_hash: dict[int, list[tuple[int, set[int]]]] = {}

    def extend(self, tokens: list[int]) -> None:
        for end in range(max(self.done, self.n - 1), len(tokens)):  # the n-gram ending at end
            self._entry(tokens, end - self.n + 1, create=True)[1].add(int(tokens[end]))
        self.done = len(tokens)

    def banned(self, tokens: list[int]) -> set[int]:
        """The tokens that would complete an n-gram already in `tokens`."""
        if len(tokens) < self.n:
            return set()
        entry = self._entry(tokens, len(tokens) - self.n + 1, create=False)
        return entry[1] if entry is not None else set()

    def _entry(self, tokens: list[int], start: int, create: bool):
        prefix = tokens[start:start + self.n - 1]
        key = hash(tuple(prefix))
        bucket = self.by_hash.get(key, [])
        for entry in bucket:
            if tokens[entry[0]:entry[0] + self.n - 1] == prefix:
                return entry
        if not create:
            return None
        entry = (start, set())
        self.by_hash.setdefault(key, bucket).append(entry)
        return entry


# -- the processors: each changes `scores` [rows, vocab] float32 in place ----------------------
def _table(processor: Any, history: History) -> Any:
    table = history.tables.get(processor)
    if table is None:
        table = history.tables[processor] = processor.new_table()
    table.extend(history.tokens)
    return table


class RepetitionPenalty:
    """transformers' RepetitionPenaltyLogitsProcessor: each token of the prompt or generated
    so far, once, multiplied by the penalty where negative, else divided by it."""

    def __init__(self, penalty: float) -> None:
        self.penalty = np.float32(penalty)

    def new_table(self) -> _Seen:
        return _Seen()

    def apply(self, scores: np.ndarray, histories: Sequence[History]) -> None:
        seen = [_table(self, h) for h in histories]
        if not seen:
            return
        rows = np.repeat(np.arange(len(seen)), [s.count for s in seen])
        ids = np.concatenate([s.ids[:s.count] for s in seen])
        picked = scores[rows, ids]
        scores[rows, ids] = np.where(picked < 0, picked * self.penalty, picked / self.penalty)


class OccurrencePenalty:
    """OpenAI's frequency and presence penalties as vLLM applies them (after the repetition
    penalty, before temperature): over the GENERATED tokens only, each id's score less
    `frequency` x its count, then less `presence` once (float32, in that order, as vLLM's
    `apply_penalties` subtracts the two products from float32 logits)."""

    def __init__(self, frequency: float, presence: float) -> None:
        self.frequency = np.float32(frequency)
        self.presence = np.float32(presence)

    def new_table(self) -> _Counts:
        return _Counts()

    def apply(self, scores: np.ndarray, histories: Sequence[History]) -> None:
        counts = []
        for h in histories:
            table = h.tables.get(self)
            if table is None:
                table = h.tables[self] = _Counts()
            table.extend(h.tokens, h.prompt_len)
            counts.append(table)
        rows = np.repeat(np.arange(len(counts)), [c.size for c in counts])
        if not len(rows):
            return
        ids = np.concatenate([c.ids[:c.size] for c in counts])
        times = np.concatenate([c.counts[:c.size] for c in counts])
        picked = scores[rows, ids]
        if self.frequency:
            picked = picked - self.frequency * times
        if self.presence:
            picked = picked - self.presence
        scores[rows, ids] = picked


class NoRepeatNGram:
    """transformers' NoRepeatNGramLogitsProcessor: -inf for every token that would complete
    an n-gram the sequence already holds."""

    def __init__(self, n: int) -> None:
        self.n = n

    def new_table(self) -> _NGrams:
        return _NGrams(self.n)

    def apply(self, scores: np.ndarray, histories: Sequence[History]) -> None:
        for row, h in enumerate(histories):
            banned = _table(self, h).banned(h.tokens)
            if banned:
                scores[row, list(banned)] = -np.inf


class SequenceBias:
    """transformers' SequenceBiasLogitsProcessor (and NoBadWordsLogitsProcessor, its -inf
    case): a one-token sequence's bias always, a longer one's when the sequence ends with all
    but its last token; biases summed in float32 in transformers' order (one-token ones, then
    by prefix length in first-seen order) before being added to the score."""

    def __init__(self, biases: Iterable[tuple[tuple[int, ...], float]]) -> None:
        unique = dict(biases)  # a repeated sequence: its last bias, at its first place
        single = {s[0]: np.float32(b) for s, b in unique.items() if len(s) == 1}
        self.single = single
        self.ids = np.fromiter(single, np.int64, len(single))
        self.values = np.fromiter(single.values(), np.float32, len(single))
        self.groups: dict[int, dict[tuple[int, ...], list[tuple[int, np.float32]]]] = {}
        for seq, bias in unique.items():
            if len(seq) > 1:
                group = self.groups.setdefault(len(seq) - 1, {})
                group.setdefault(seq[:-1], []).append((seq[-1], np.float32(bias)))

    def apply(self, scores: np.ndarray, histories: Sequence[History]) -> None:
        matched = [self._matched(h.tokens) for h in histories]
        plain = [row for row, m in enumerate(matched) if not m]
        if plain and len(self.ids):
            scores[np.ix_(plain, self.ids)] += self.values
        for row, bias in enumerate(matched):
            if bias:
                ids = np.fromiter(bias, np.int64, len(bias))
                scores[row, ids] += np.fromiter(bias.values(), np.float32, len(bias))

    def _matched(self, tokens: list[int]) -> dict[int, np.float32]:
        """{token: its whole bias} when a longer sequence matches (every one-token bias
        included); {} when none does."""
        bias: dict[int, np.float32] = {}
        for length, prefixes in self.groups.items():
            if length <= len(tokens):
                for last, value in prefixes.get(tuple(tokens[-length:]), ()):
                    bias[last] = np.float32(bias.get(last, self.single.get(last, 0.0)) + value)
        return {**self.single, **bias} if bias else bias


@dataclass(frozen=True)
class Ban:
    """-inf for `tokens` in the rows where `when` holds: transformers' MinLength,
    MinNewTokensLength (the EOS ids), SuppressTokens and SuppressTokensAtBegin."""
    tokens: tuple[int, ...]
    when: Callable[[History], bool]

    def apply(self, scores: np.ndarray, histories: Sequence[History]) -> None:
        rows = [row for row, h in enumerate(histories) if self.when(h)]
        if rows and self.tokens:
            scores[np.ix_(rows, self.tokens)] = -np.inf


@dataclass(frozen=True)
class Force:
    """Every token -inf but `tokens` (0) in the rows where `when` holds: transformers'
    ForcedBOSTokenLogitsProcessor and ForcedEOSTokenLogitsProcessor."""
    tokens: tuple[int, ...]
    when: Callable[[History], bool]

    def apply(self, scores: np.ndarray, histories: Sequence[History]) -> None:
        rows = [row for row, h in enumerate(histories) if self.when(h)]
        if rows:
            scores[rows] = -np.inf
            scores[np.ix_(rows, self.tokens)] = 0.0
