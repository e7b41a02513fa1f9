"""Iteration-level scheduling of sequences over one paged KV cache (continuous batching).

Every step packs, first come first served, the next token of each running sequence and chunks
of the prompts still being read, within a token budget (`max_batch_tokens`, prompt chunks of at
most `prefill_chunk`). A sequence holds cache blocks for the tokens it has cached; before a step
each member grows its table, and when the pool runs dry the newest sequence is preempted: its
blocks are freed and it goes back to the front of the queue, to be recomputed from its tokens
(prompt and what it generated so far) when blocks free up, so nothing is lost. A finished or
cancelled sequence frees its blocks at once. `generate` and the server drive the same loop.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..sampling import SamplingParams, next_tokens
from .engine import StepRunner
from .step import StepPart

GREEDY = SamplingParams()


@dataclass(eq=False)
class Sequence:
    """One request: its tokens so far (prompt, then generated), how many are cached, and when
    it stops."""
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

    def __post_init__(self) -> None:
        self.prompt_len = self.prompt_len or len(self.tokens)

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len:]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class TokenEvent:
    sequence: Sequence
    token: int


class Scheduler:
    def __init__(self, runner: StepRunner, max_batch_tokens: int | None = None,
                 prefill_chunk: int | None = None):
        self.runner = runner
        # a step packs no more tokens than the step graph was compiled for
        self.budget = min(max_batch_tokens or runner.spec.max_batch_tokens,
                          runner.max_step_tokens or math.inf)
        self.chunk = min(prefill_chunk or runner.spec.prefill_chunk, self.budget)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0
        self.on_step: Callable[[int, int], None] | None = None  # (tokens, sequences) per step

    @property
    def allocator(self):
        return self.runner.allocator

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

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
        parts = [StepPart(np.asarray(seq.tokens[seq.cached:seq.cached + n], np.int64),
                          seq.cached, self.allocator.tables[id(seq)],
                          seq.cached + n == len(seq.tokens), seq.images) for seq, n in members]
        logits, rows = self.runner.run(parts)
        if self.on_step is not None:
            self.on_step(sum(n for _, n in members), len(members))
        for seq, n in members:
            seq.cached += n
        wanted = [(members[i][0], row) for row, i in enumerate(rows) if parts[i].logits]
        return [self._advance(seq, token)
                for (seq, _), token in zip(wanted, self._sample(wanted, logits))]

    # -- planning -----------------------------------------------------------------------------
    def _plan(self) -> list[tuple[Sequence, int]]:
        """The step's members and how many tokens each adds, growing their block tables."""
        budget, members = self.budget, []
        candidates = list(self.running)
        while self.waiting:  # admitted in order; stops at the first that cannot start
            candidates.append(self.waiting[0])
            if not self._fits_first_chunk(self.waiting[0], budget, candidates):
                candidates.pop()
                break
            self.running.append(self.waiting.popleft())
        for seq in list(self.running):
            if seq not in self.running or budget == 0:
                continue
            n = min(len(seq.tokens) - seq.cached, self.chunk, budget)
            if not self._reserve(seq, seq.cached + n):
                continue
            members.append((seq, n))
            budget -= n
        return [(s, n) for s, n in members if s in self.running]

    def _fits_first_chunk(self, seq: Sequence, budget: int, _candidates) -> bool:
        need = min(len(seq.tokens), self.chunk, max(budget, 1))
        return self.allocator.fits(id(seq), need)

    def _reserve(self, seq: Sequence, length: int) -> bool:
        """Blocks for `length` tokens of `seq`, preempting the newest others when short;
        False when `seq` itself was the newest and got preempted."""
        while not self.allocator.fits(id(seq), length):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        self.allocator.grow(id(seq), length)
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.allocator.release(id(seq))
        self.running.remove(seq)
        seq.cached = 0
        seq.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)

    def _drop(self, seq: Sequence) -> None:
        self.allocator.release(id(seq))
        if seq in self.running:
            self.running.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)

    # -- tokens -------------------------------------------------------------------------------
    @staticmethod
    def _sample(wanted: list[tuple[Sequence, int]], logits: np.ndarray) -> list[int]:
        """Each sequence's next token from its logits row. The greedy rows go through one
        argmax together (a row's argmax does not depend on the others, so batching keeps
        every answer token-identical to the request alone); a sampled row draws from its own
        generator, alone."""
        tokens = [0] * len(wanted)
        greedy = [k for k, (seq, _) in enumerate(wanted) if not seq.sampling.do_sample]
        if greedy:
            rows = [wanted[k][1] for k in greedy]
            for k, token in zip(greedy, _argmax_rows(logits, rows).tolist()):
                tokens[k] = token
        for k, (seq, row) in enumerate(wanted):
            if seq.sampling.do_sample:
                tokens[k] = int(next_tokens(logits[row:row + 1], seq.sampling, seq.rng)[0])
        return tokens

    def _advance(self, seq: Sequence, token: int) -> TokenEvent:
        seq.tokens.append(token)
        if token in seq.eos_token_ids:
            seq.finish_reason = "stop"
        elif len(seq.generated) >= seq.max_new_tokens:
            seq.finish_reason = "length"
        if seq.finished:
            self._drop(seq)
        return TokenEvent(seq, token)


def _argmax_rows(logits: np.ndarray, rows: list[int]) -> np.ndarray:
    """`next_tokens(logits[rows], greedy)` in one pass over the rows (no copy when they are
    the first ones in order): argmax takes a NaN for the maximum, so a row holding one shows
    it at its pick, and only then does `next_tokens` run, to raise its error."""
    chosen = logits[:len(rows)] if rows == list(range(len(rows))) else logits[rows]
    picks = np.argmax(chosen, axis=1)
    if np.isnan(chosen[np.arange(len(rows)), picks]).any():
        return next_tokens(chosen, GREEDY)
    return picks
