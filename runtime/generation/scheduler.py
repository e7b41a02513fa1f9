"""Iteration-level scheduling of sequences over one paged KV cache (continuous batching).

Every step packs, first come first served, the next token of each running sequence and chunks
of the prompts still being read, within a token budget (`max_batch_tokens`, prompt chunks of at
most `prefill_chunk`). A sequence holds cache blocks for the tokens it has cached; before a step
each member grows its table, and when the pool runs dry the newest sequence is preempted: its
blocks are freed and it goes back to the front of the queue, to be recomputed from its tokens
(prompt and what it generated so far) when blocks free up, so nothing is lost. A finished or
cancelled sequence frees its blocks at once. `generate` and the server drive the same loop.

With prefix caching (on unless `prefix_cache=False`; runtime/prefix_cache.py), a block is
named by the digest of its prefix once the step that filled it has run, and a sequence
admitted from the queue (new, or preempted and back) starts with every cached full block of
its tokens but the last (whose logits it needs): its `cached` count starts there and its
first step computes only the rest. A sequence's digests are made once, as its blocks fill.

A step costs O(the sequences in it), however many wait: the queue and the running set are
insertion-ordered dicts keyed by a sequence's stable id (membership, removal, front and back
in O(1)), planning walks the running sequences from the oldest only while the budget lasts and
admits from the queue's front only while budget and blocks remain, so at most `budget`
sequences ever run (each takes at least one token a step).

A sequence with logit processors (its generation config's: runtime/logit_processors.py) has
its row processed before its token is chosen, greedy or sampled, together with the other rows
of the step that share its processors; a sequence without them costs nothing more.

A logits row with NaN or +inf, or -inf for every token, gives that sequence no token: it ends
with finish_reason "error", an event with token -1 and the reason in `error`, and frees its
blocks; the other sequences of the step go on untouched.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.errors import InputError

from ..logit_processors import History, LogitProcessors
from ..prefix_cache import extend_chain
from ..sampling import SamplingParams, next_tokens, row_error
from .engine import StepRunner
from .step import StepPart

_NEXT_ID = itertools.count()  # itertools.count is atomic under the GIL: ids are unique


@dataclass(eq=False)
class Sequence:
    """One request: its tokens so far (prompt, then generated), how many are cached, and when
    it stops. `seq_id` is its stable key (the scheduler's and the block allocator's).
    `processors`: its generation config's logit processors (`LogitProcessors.for_call`);
    `history` is what they keep of it, None when it has none active. `cached_prompt_tokens`:
    how many of its prompt tokens were found in the prefix cache when it was first admitted
    (`usage.prompt_tokens_details.cached_tokens`); `block_hashes`: its full blocks' digests."""
    tokens: list[int]
    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    eos_token_ids: frozenset[int] = frozenset()
    rng: np.random.Generator | None = None
    prompt_len: int = 0
    cached: int = 0
    finish_reason: str | None = None
    preemptions: int = 0
    images: Any = None  # vision.ImageRows of the prompt's image tokens, if it has images
    cached_prompt_tokens: int = field(default=0, init=False)  # prompt tokens found cached
    error: str | None = None  # why it ended with finish_reason "error"
    seq_id: int = field(default_factory=lambda: next(_NEXT_ID))
    processors: LogitProcessors | None = None
    history: History | None = field(default=None, init=False, repr=False)
    block_hashes: list[bytes] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self.prompt_len = self.prompt_len or len(self.tokens)
        if self.processors is not None and self.processors.active:
            self.history = self.processors.history(self.tokens, self.prompt_len,
                                                   self.max_new_tokens)

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len:]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class TokenEvent:
    """A sequence's new token; or, when `error` is set, token -1 and the reason it ended with
    finish_reason "error" (its last event: it has no token and freed its blocks)."""
    sequence: Sequence
    token: int
    error: str | None = None


class Scheduler:
    def __init__(self, runner: StepRunner, max_batch_tokens: int | None = None,
                 prefill_chunk: int | None = None, prefix_cache: bool = True):
        self.runner = runner
        self.prefix_cache = prefix_cache
        # a step packs no more tokens than the step graph was compiled for
        self.budget = min(max_batch_tokens or runner.spec.max_batch_tokens,
                          runner.max_step_tokens or math.inf)
        self.chunk = min(prefill_chunk or runner.spec.prefill_chunk, self.budget)
        # by seq_id, in order: the queue (front first) and the running set (oldest first)
        self.waiting: OrderedDict[int, Sequence] = OrderedDict()
        self.running: OrderedDict[int, Sequence] = OrderedDict()
        self.preemptions = 0
        self.on_step: Callable[[int, int], None] | None = None  # (tokens, sequences) per step

    @property
    def allocator(self):
        return self.runner.allocator

    def add(self, seq: Sequence) -> None:
        self.waiting[seq.seq_id] = seq

    def cancel(self, seq: Sequence) -> None:
        """Stop `seq` now and free its blocks."""
        seq.finish_reason = seq.finish_reason or "cancelled"
        self._drop(seq)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def run(self) -> Iterator[TokenEvent]:
        """Step until every sequence has finished, yielding each new token as it comes."""
        while not self.idle:
            yield from self.step()

    def step(self) -> list[TokenEvent]:
        members = self._plan()
        if not members:
            return []
        tables = self.allocator.tables
        parts = [StepPart(np.asarray(seq.tokens[seq.cached:seq.cached + n], np.int64),
                          seq.cached, tables[seq.seq_id], seq.cached + n == len(seq.tokens),
                          seq.images) for seq, n in members]
        logits, rows = self.runner.run(parts)
        if self.on_step is not None:
            self.on_step(sum(n for _, n in members), len(members))
        for seq, n in members:
            seq.cached += n
        if self.prefix_cache:
            self._commit(members)
        wanted = [(members[i][0], row) for row, i in enumerate(rows) if parts[i].logits]
        errors: dict[int, str] = {}
        tokens = self._sample(wanted, logits, errors)
        return [self._advance(seq, token, errors.get(k))
                for k, ((seq, _), token) in enumerate(zip(wanted, tokens))]

    # -- planning -----------------------------------------------------------------------------
    def _plan(self) -> list[tuple[Sequence, int]]:
        """The step's members and how many tokens each adds, growing their block tables: the
        running sequences oldest first while the budget lasts, then the queue's front while
        budget and blocks last (first come first served: it stops at the first that cannot
        start). Looks at no sequence beyond the step's members, one more, and those it
        preempts (newest first; they leave the running set once the walk is over)."""
        budget, members = self.budget, []
        newest, preempted = reversed(self.running.values()), []
        for seq in self.running.values():
            if budget == 0 or (preempted and seq is preempted[-1]):
                break  # the budget is spent, or the rest were preempted
            n = min(len(seq.tokens) - seq.cached, self.chunk, budget)
            if not self._reserve(seq, seq.cached + n, newest, preempted):
                break  # `seq` itself was the newest left
            members.append((seq, n))
            budget -= n
        for seq in preempted:  # newest first: each to the queue's front, the oldest ends first
            del self.running[seq.seq_id]
            self.waiting[seq.seq_id] = seq
            self.waiting.move_to_end(seq.seq_id, last=False)
        while budget > 0 and self.waiting:
            seq = next(iter(self.waiting.values()))
            reuse = self._cached_prefix(seq) if self.prefix_cache else ()
            cached = len(reuse) * self.allocator.block_size  # 0 without: it holds no block
            n = min(len(seq.tokens) - cached, self.chunk, budget)
            if not self.allocator.fits(seq.seq_id, cached + n, reuse):
                break
            del self.waiting[seq.seq_id]
            self.running[seq.seq_id] = seq
            self.allocator.grow(seq.seq_id, cached + n, reuse)
            seq.cached = cached
            if self.prefix_cache and not seq.preemptions:  # a request's prompt, counted once
                seq.cached_prompt_tokens = cached
                self.allocator.prefix_queries += len(seq.tokens)
                self.allocator.prefix_hits += cached
            members.append((seq, n))
            budget -= n
        return members

    def _cached_prefix(self, seq: Sequence) -> list[int]:
        """The cached blocks `seq` can start with: those of its longest cached prefix of full
        blocks, its last token left out (it must be computed: its logits give the next)."""
        size = self.allocator.block_size
        upto = (len(seq.tokens) - 1) // size
        chain = seq.block_hashes
        if len(chain) < upto:
            extend_chain(chain, seq.tokens, seq.images, size, upto)
        return self.allocator.match(chain[:upto])

    def _commit(self, members: list[tuple[Sequence, int]]) -> None:
        """Name the blocks this step filled (their keys and values are final now) by their
        prefix digests, for later sequences to reuse: a member whose step filled no block
        costs a lookup."""
        allocator = self.allocator
        size, committed = allocator.block_size, allocator.committed
        for seq, _ in members:
            full = seq.cached // size
            if full > committed.get(seq.seq_id, 0):
                chain = seq.block_hashes
                if len(chain) < full:
                    extend_chain(chain, seq.tokens, seq.images, size, full)
                allocator.commit(seq.seq_id, chain, full)

    def _reserve(self, seq: Sequence, length: int, newest: Iterator[Sequence],
                 preempted: list[Sequence]) -> bool:
        """Blocks for `length` tokens of `seq`, preempting the newest others (`newest` walks
        the running set from its end) when short; False when `seq` itself was the newest
        left and got preempted."""
        while not self.allocator.fits(seq.seq_id, length):
            victim = next(newest)
            self.allocator.release(victim.seq_id)
            victim.cached = 0
            victim.preemptions += 1
            self.preemptions += 1
            preempted.append(victim)
            if victim is seq:
                return False
        self.allocator.grow(seq.seq_id, length)
        return True

    def _drop(self, seq: Sequence) -> None:
        self.allocator.release(seq.seq_id)
        self.running.pop(seq.seq_id, None)
        self.waiting.pop(seq.seq_id, None)

    # -- tokens -------------------------------------------------------------------------------
    @staticmethod
    def _sample(wanted: list[tuple[Sequence, int]], logits: np.ndarray,
                errors: dict[int, str] | None = None) -> list[int]:
        """Each sequence's next token from its logits row (processed, if it has processors:
        `_processed`). The greedy rows of one array go through one argmax together (a row's
        argmax does not depend on the others, so batching keeps every answer token-identical
        to the request alone); a sampled row draws from its own generator, alone. A row
        without a distribution (`row_error`) gets token -1 and its reason in `errors` under
        its index; without `errors`, it raises InputError."""
        tokens = [-1] * len(wanted)
        problems: dict[int, str] = {}
        rows = _processed(wanted, logits, problems)
        greedy: dict[int, tuple[np.ndarray, list[int], list[int]]] = {}
        for k, (seq, _) in enumerate(wanted):
            if k in problems:
                continue
            array, row = rows[k]
            if not seq.sampling.do_sample:
                group = greedy.setdefault(id(array), (array, [], []))
                group[1].append(k)
                group[2].append(row)
                continue
            values = array[row:row + 1]
            if np.isfinite(values.max()):
                tokens[k] = int(next_tokens(values, seq.sampling, seq.rng)[0])
            else:
                problems[k] = row_error(values)
        for array, ks, picked in greedy.values():
            picks, bad = _argmax_rows(array, picked)
            for k, token in zip(ks, picks):
                tokens[k] = token
            problems.update((ks[j], problem) for j, problem in bad.items())
        if errors is None and problems:
            k = min(problems)
            raise InputError(f"the logits of sequence {k} {problems[k]}", "logits",
                             "the model produced non-finite logits (check its inputs and "
                             "weights: `dayzero align`)")
        if errors is not None:
            errors.update(problems)
        return tokens

    def _advance(self, seq: Sequence, token: int, problem: str | None = None) -> TokenEvent:
        if problem is not None:
            seq.finish_reason = "error"
            seq.error = f"the logits for its next token (position {len(seq.tokens)}) {problem}"
            self._drop(seq)
            return TokenEvent(seq, -1, seq.error)
        seq.tokens.append(token)
        if token in seq.eos_token_ids:
            seq.finish_reason = "stop"
        elif len(seq.tokens) - seq.prompt_len >= seq.max_new_tokens:  # no copy of them
            seq.finish_reason = "length"
        if seq.finished:
            self._drop(seq)
        return TokenEvent(seq, token)


def _processed(wanted: list[tuple[Sequence, int]], logits: np.ndarray,
               problems: dict[int, str]) -> list[tuple[np.ndarray, int]]:
    """Where each wanted sequence's token is chosen from: (array, row), its row of the step's
    `logits`, or, with processors, of the scores its processors made, one `apply` for the
    rows sharing them. A row the processors left without a token (-inf everywhere, the
    model's was finite) gets its reason in `problems`."""
    where = [(logits, row) for _, row in wanted]
    groups: dict[int, list[int]] = {}
    for k, (seq, _) in enumerate(wanted):
        if seq.history is not None:
            groups.setdefault(id(seq.processors), []).append(k)
    for ks in groups.values():
        processors = wanted[ks[0]][0].processors
        raw = logits[[wanted[k][1] for k in ks]]
        scores = processors.apply(raw, [wanted[k][0].history for k in ks])
        emptied = np.isneginf(scores.max(axis=1)) & np.isfinite(raw.max(axis=1))
        for j, k in enumerate(ks):
            where[k] = (scores, j)
            if emptied[j]:
                problems[k] = ("are -inf for every token after the generation config's "
                               f"logit processors ({', '.join(processors.names)})")
    return where


def _argmax_rows(logits: np.ndarray, rows: list[int]) -> tuple[list[int], dict[int, str]]:
    """Greedy picks of `logits[rows]` in one pass (no copy when they are the first rows in
    order), and the `row_error` of each row that has no distribution, by its index in `rows`
    (its pick is -1): argmax lands on a NaN or a +inf if the row holds one, and on a -inf only
    if every entry is one, so checking the picked values finds every such row."""
    chosen = logits[:len(rows)] if rows == list(range(len(rows))) else logits[rows]
    picks = np.argmax(chosen, axis=1)
    tokens = picks.tolist()
    bad = {}
    for k in np.flatnonzero(~np.isfinite(chosen[np.arange(len(rows)), picks])).tolist():
        tokens[k] = -1
        bad[k] = row_error(chosen[k])
    return tokens, bad
