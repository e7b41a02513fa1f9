"""The Scheduler with a fake step runner whose logits the test chooses (issue 33): a row with
NaN, +inf or every token -inf ends that sequence with an error event and frees its blocks
while the rest of the batch goes on untouched; and a step costs O(its sequences), counted
(attribute reads and comparisons on sequences), not timed, over 100 and 1,000 prompts."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from runtime.generation.scheduler import Scheduler, Sequence
from runtime.kv_cache import BlockAllocator
from runtime.sampling import SamplingParams

VOCAB = 256
NAN, PLUS_INF, ALL_MINUS_INF, MASKED = 200, 210, 220, 240  # apart: no chain meets two


def _row(last: int) -> np.ndarray:
    """The logits after token `last`: the next token is last + 1, except after the markers
    (a NaN row, a +inf row, a row -inf everywhere; or, after MASKED, -inf everywhere but
    tokens 100 and 101: a legitimate mask)."""
    row = np.zeros(VOCAB, np.float32)
    row[(last + 1) % VOCAB] = 10.0
    if last == NAN:
        row[3] = np.nan
    elif last == PLUS_INF:
        row[7] = np.inf
    elif last in (ALL_MINUS_INF, MASKED):
        row[:] = -np.inf
        if last == MASKED:
            row[100], row[101] = 1.0, 3.0
    return row


class FakeRunner:
    """What the Scheduler uses of a StepRunner: spec's budget and chunk, the allocator, and
    run(parts) -> (logits rows, part per row), the rows from `_row` of each part's last
    token. It checks every part's block table covers its tokens."""

    def __init__(self, budget: int = 16, chunk: int = 8, blocks: int = 4096,
                 block_size: int = 4):
        self.spec = SimpleNamespace(max_batch_tokens=budget, prefill_chunk=chunk)
        self.max_step_tokens = None
        self.allocator = BlockAllocator(blocks, block_size)
        self.step_sizes: list[int] = []

    def run(self, parts):
        for part in parts:
            assert len(part.table) * self.allocator.block_size >= part.start + len(part.tokens)
        rows = [i for i, p in enumerate(parts) if p.logits] or [len(parts) - 1]
        self.step_sizes.append(len(parts))
        return np.stack([_row(int(parts[i].tokens[-1])) for i in rows]), rows


GREEDY = SamplingParams()


def _run(prompts, max_new_tokens=6, sampling=GREEDY, **runner):
    scheduler = Scheduler(FakeRunner(**runner))
    seqs = [Sequence(list(p), max_new_tokens, sampling, rng=np.random.default_rng(i))
            for i, p in enumerate(prompts)]
    for seq in seqs:
        scheduler.add(seq)
    events = []
    while not scheduler.idle:
        step = scheduler.step()
        for event in step:
            if event.error is not None:  # its blocks are free the moment its event comes
                assert event.sequence.seq_id not in scheduler.allocator.tables
        events.extend(step)
    return seqs, events, scheduler


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(True, 0.8, seed=1)])
@pytest.mark.parametrize("marker, words", [(NAN, "contain NaN"), (PLUS_INF, "contain +inf"),
                                           (ALL_MINUS_INF, "are -inf for every token")])
def test_a_bad_row_ends_its_sequence_alone(marker, words, sampling):
    prompts = [[5, 6, 7], [marker - 2], [40, 41], [MASKED]]
    seqs, events, scheduler = _run(prompts, sampling=sampling)
    bad = seqs[1]
    assert bad.finish_reason == "error" and words in bad.error
    assert bad.generated == [marker - 1, marker]  # the tokens before the bad row stay
    errors = [e for e in events if e.error is not None]
    assert len(errors) == 1 and errors[0].sequence is bad and errors[0].token == -1
    assert errors[0] is [e for e in events if e.sequence is bad][-1]  # its last event
    assert errors[0].error == bad.error
    # the others: every token, exactly as each alone
    for i in (0, 2, 3):
        alone, _, _ = _run([prompts[i]], sampling=sampling)
        assert seqs[i].generated == alone[0].generated and len(seqs[i].generated) == 6
        assert seqs[i].finish_reason == "length"
    assert seqs[3].generated[0] in (100, 101)  # a -inf mask is no error
    assert scheduler.allocator.used == 0 and scheduler.idle


def test_a_prompt_whose_first_logits_are_bad_ends_before_any_token():
    seqs, events, scheduler = _run([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, NAN], [3]], chunk=4)
    assert seqs[0].generated == [] and seqs[0].finish_reason == "error"
    assert "position 11" in seqs[0].error
    assert [e.token for e in events if e.sequence is seqs[1]] == [4, 5, 6, 7, 8, 9]
    assert scheduler.allocator.used == 0


class CountingSequence(Sequence):
    """A Sequence that counts every attribute read and equality test made on it: the
    scheduler's work on sequences, whatever container or loop it is done in."""

    touches = 0
    __hash__ = Sequence.__hash__

    def __getattribute__(self, name):
        CountingSequence.touches += 1
        return object.__getattribute__(self, name)

    def __eq__(self, other):
        CountingSequence.touches += 1
        return self is other


PER_SEQUENCE = 40


def _count(n: int, blocks: int | None = None) -> tuple[list[tuple[int, int]], int, int]:
    """Run n prompts (2-6 tokens, 3 new each) with a budget of 16 tokens; per step (touches,
    sequences in the step or preempted by it), the total touches, the most ever running
    (-1 if a pool of `blocks` never made it preempt)."""
    rng = np.random.default_rng(n)
    runner = FakeRunner(budget=16, chunk=8, blocks=blocks or 8 * n)
    scheduler = Scheduler(runner)
    for length in rng.integers(2, 7, n):
        scheduler.add(CountingSequence(rng.integers(3, 150, length).tolist(), 3))
    steps, most_running = [], 0
    CountingSequence.touches = 0
    while not scheduler.idle:
        before, preempted = CountingSequence.touches, scheduler.preemptions
        scheduler.step()
        steps.append((CountingSequence.touches - before,
                      runner.step_sizes[-1] + scheduler.preemptions - preempted))
        most_running = max(most_running, len(scheduler.running))
    if blocks is not None and not scheduler.preemptions:
        most_running = -1
    return steps, CountingSequence.touches, most_running


@pytest.mark.parametrize("tight", [False, True])
def test_each_step_costs_its_own_sequences_not_the_queue(tight):
    # tight: 10 blocks of 4 tokens for sequences of up to 9, so growing ones preempt others
    small, small_total, _ = _count(100, 10 if tight else None)
    big, big_total, most_running = _count(1000, 10 if tight else None)
    # per step: a constant per sequence in the step (plus one looked at and left), however
    # long the queue (about 24 reads a sequence today; walking the queue or a list
    # membership test costs hundreds a step at 1,000 prompts)
    assert all(t <= PER_SEQUENCE * (s + 1) for t, s in small + big)
    assert big_total <= 11 * small_total  # 10x the prompts: 10x the work
    assert 0 <= most_running <= 16  # every running sequence takes a token of the budget


def test_cancelling_a_waiting_sequence_does_not_walk_the_queue():
    scheduler = Scheduler(FakeRunner())
    seqs = [CountingSequence([3, 4], 2) for _ in range(1000)]
    for seq in seqs:
        scheduler.add(seq)
    CountingSequence.touches = 0
    scheduler.cancel(seqs[500])
    assert CountingSequence.touches < 20
    assert seqs[500].finish_reason == "cancelled" and len(scheduler.waiting) == 999


def test_preemption_under_a_full_pool_loses_nothing_and_keeps_order():
    prompts = [[10 * i + 3] * 6 for i in range(6)]
    roomy, _, _ = _run(prompts, max_new_tokens=10)
    # 16 tokens a sequence need 4 blocks of 4: 10 blocks hold two at a time
    tight, events, scheduler = _run(prompts, max_new_tokens=10, blocks=10)
    assert [s.generated for s in tight] == [s.generated for s in roomy]
    assert scheduler.preemptions > 0 and scheduler.allocator.used == 0
    assert all(e.error is None for e in events)
