"""Automatic prefix caching (issue 39, item 1): the allocator's books (digest chain, reference
counts, LRU eviction, partial blocks never shared), the scheduler over a fake runner whose
output depends on every cached token it reads back (so a wrong block changes the answer), its
per-step cost, and a tiny llama whose greedy output over 100 requests with shared prefixes is
the same with the cache as without, roomy or tight enough to evict and preempt."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import numpy as np
import pytest

import runtime
from runtime.generation.scheduler import Scheduler, Sequence
from runtime.generation.vision import ImageRows
from runtime.kv_cache import BlockAllocator, CacheFullError
from runtime.prefix_cache import ROOT, block_digest, extend_chain
from tests.generation.test_scheduler_edges import PER_SEQUENCE, CountingSequence
from tests.generation.tiny_lms import compile_lm, tiny_lm

BS = 4


def _chain(tokens, images=None, size=BS):
    return extend_chain([], tokens, images, size, len(tokens) // size)


# -- the digest chain ---------------------------------------------------------------------------
def test_a_block_digest_is_blake2b_over_its_tokens_and_its_parent():
    want = hashlib.blake2b(ROOT + np.asarray([5, 6, 7, 8], np.int64).tobytes(),
                           digest_size=32).digest()
    assert block_digest(ROOT, [5, 6, 7, 8]) == want  # stable across processes: no hash()
    a, b = _chain([5, 6, 7, 8, 1, 2, 3, 4, 9]), _chain([5, 6, 7, 8, 1, 2, 3, 5])
    assert len(a) == 2 and a[0] == want and a[1] == block_digest(want, [1, 2, 3, 4])
    assert a[0] == b[0] and a[1] != b[1]
    # the same block after another prefix is another block
    assert _chain([0, 0, 0, 0, 1, 2, 3, 4])[1] != a[1]


def test_image_rows_are_part_of_a_blocks_digest():
    tokens = [5, 6, 7, 8, 9, 99, 99, 10, 11, 12, 13, 14]
    rows = np.arange(2 * 3, dtype=np.float32).reshape(2, 3)
    first = _chain(tokens, ImageRows(np.array([5, 6]), rows))
    other = _chain(tokens, ImageRows(np.array([5, 6]), rows + 1))
    assert first[0] == other[0] == _chain(tokens)[0]  # no image token in the first block
    assert first[1] != other[1] and first[2] != other[2]  # the image's block and after
    assert first == _chain(tokens, ImageRows(np.array([5, 6]), rows.copy()))


# -- the allocator's books ----------------------------------------------------------------------
def _filled(pool, seq, tokens):
    """`seq` admitted with `tokens` written and its full blocks named; its table and chain."""
    chain = _chain(tokens)
    table = list(pool.grow(seq, len(tokens)))
    pool.commit(seq, chain, len(chain))
    return table, chain


def test_shared_blocks_are_counted_and_stay_cached_when_released():
    pool = BlockAllocator(num_blocks=8, block_size=BS)
    a, chain = _filled(pool, "a", list(range(10)))           # blocks 0, 1 full; 2 partial
    assert pool.cached_blocks == 2 and pool.match(chain) == a[:2]
    assert pool.match(_chain(list(range(12)))) == a[:2]       # the partial block: never shared
    b = pool.grow("b", 10, reuse=pool.match(chain))
    assert b[:2] == a[:2] and b[2] not in a and pool.used == 4
    assert [pool.refs[k] for k in a[:2]] == [2, 2]
    pool.release("a")
    assert pool.used == 3 and a[2] in pool.free and not pool.cache.evictable
    pool.release("b")
    assert pool.used == 0 and pool.cached_blocks == 2
    assert list(pool.cache.evictable) == [a[1], a[0]]  # a prefix is evicted from its end
    assert pool.match(chain) == a[:2]                    # still cached after everyone left


def test_eviction_takes_free_blocks_first_then_the_least_recently_released():
    pool = BlockAllocator(num_blocks=6, block_size=BS)
    a, ca = _filled(pool, "a", [1] * 8)
    b, cb = _filled(pool, "b", [2] * 8)
    pool.grow("c", 8)
    pool.release("a")
    pool.release("b")
    pool.release("c")
    assert pool.used == 0 and len(pool.free) == 2 and pool.available == 6
    pool.grow("e", 4, reuse=pool.match(ca)[:1])   # a's first block used again: recent now
    pool.release("e")
    d = pool.grow("d", 16)                          # 2 free, then a[1], then b[1]
    assert d[2:] == [a[1], b[1]] and pool.cache.evictions == 2
    assert pool.match(ca) == a[:1] and pool.match(cb) == b[:1]
    assert pool.fits("d", 24) and not pool.fits("d", 25)
    pool.grow("d", 24)
    assert pool.match(ca) == [] and pool.cached_blocks == 0 and pool.available == 0
    with pytest.raises(CacheFullError, match="0 of 6 are free"):
        pool.grow("d", 25)


def test_fits_counts_the_evictable_blocks_a_newcomer_takes_as_taken():
    pool = BlockAllocator(num_blocks=3, block_size=BS)
    _, chain = _filled(pool, "a", [7] * 8)
    pool.release("a")
    hit = pool.match(chain)
    assert len(hit) == 2 and pool.available == 3
    assert pool.fits("b", 12, hit) and not pool.fits("b", 13, hit)
    assert pool.grow("b", 12, hit)[:2] == hit and pool.used == 3


def test_a_prefix_computed_twice_at_once_keeps_the_first_block_and_frees_the_other():
    pool = BlockAllocator(num_blocks=4, block_size=BS)
    a, chain = _filled(pool, "a", [3] * 4)
    b, _ = _filled(pool, "b", [3] * 4)
    assert pool.match(chain) == a and pool.cached_blocks == 1
    pool.release("b")
    assert b[0] in pool.free and pool.refs[b[0]] == 0


# -- the scheduler over a runner that reads every cached token back ------------------------------
class PrefixRunner:
    """A step runner whose keys are the tokens themselves: each pool slot holds the tuple of
    every token up to its position, as the sequence that wrote it had them; a part reads its
    cached prefix back through its block table (checking every slot agrees) and the next
    token is a function of that whole prefix. It asserts no step writes a shared or named
    block, and counts the tokens it computes."""

    def __init__(self, blocks: int = 4096, budget: int = 16, chunk: int = 8):
        self.spec = SimpleNamespace(max_batch_tokens=budget, prefill_chunk=chunk)
        self.max_step_tokens = None
        self.allocator = BlockAllocator(blocks, BS)
        self.slots: dict[int, tuple[int, ...]] = {}
        self.computed = 0
        self.parts = 0

    def run(self, parts):
        alloc, rows = self.allocator, []
        for part in parts:
            def slot(p, table=part.table):
                return table[p // BS] * BS + p % BS
            prefix = self.slots[slot(part.start - 1)] if part.start else ()
            assert len(prefix) == part.start
            assert all(self.slots[slot(p)] == prefix[:p + 1] for p in range(part.start))
            for t, token in enumerate(part.tokens.tolist()):
                block = part.table[(part.start + t) // BS]
                assert alloc.refs[block] == 1 and block not in alloc.cache.digest_of
                prefix = prefix + (token,)
                self.slots[slot(part.start + t)] = prefix
            self.computed += len(part.tokens)
            self.parts += 1
            row = np.zeros(256, np.float32)
            row[3 + sum((i + 1) * v for i, v in enumerate(prefix)) * 2654435761 % 250] = 1
            rows.append(row)
        wanted = [i for i, p in enumerate(parts) if p.logits] or [len(parts) - 1]
        return np.stack([rows[i] for i in wanted]), wanted


def _shared_prompts(n: int, seed: int, size=(20, 60), suffix=(1, 20)) -> list[list[int]]:
    """n prompts: one of a few system prompts then a random suffix; some repeated whole."""
    rng = np.random.default_rng(seed)
    systems = [rng.integers(3, 250, rng.integers(*size, endpoint=True)).tolist()
               for _ in range(4)]
    prompts = []
    for _ in range(n):
        if prompts and rng.random() < 0.1:
            prompts.append(list(prompts[rng.integers(len(prompts))]))
        else:
            prompts.append(systems[rng.integers(4)]
                           + rng.integers(3, 250, rng.integers(*suffix, endpoint=True)).tolist())
    return prompts


def _serve(runner, prompts, prefix_cache=True, max_new_tokens=5, per_step=2, **options):
    """Requests arriving `per_step` before each step, as a server gets them; the sequences
    and the scheduler once every one has finished."""
    scheduler = Scheduler(runner, prefix_cache=prefix_cache, **options)
    seqs = [Sequence(list(p), max_new_tokens) for p in prompts]
    for first in range(0, len(seqs), per_step):
        for seq in seqs[first:first + per_step]:
            scheduler.add(seq)
        scheduler.step()
    while not scheduler.idle:
        scheduler.step()
    assert all(s.finish_reason == "length" for s in seqs)
    assert scheduler.allocator.used == 0
    return seqs, scheduler


def test_shared_prefixes_are_reused_and_answer_as_without_the_cache():
    prompts = _shared_prompts(100, seed=0)
    off_runner, on_runner = PrefixRunner(), PrefixRunner()
    off, _ = _serve(off_runner, prompts, prefix_cache=False)
    on, scheduler = _serve(on_runner, prompts)
    assert [s.generated for s in on] == [s.generated for s in off]
    assert len({tuple(s.generated) for s in on}) > 50  # the answers differ: a real check
    alloc = scheduler.allocator
    assert alloc.prefix_queries == sum(map(len, prompts))
    assert alloc.prefix_hits == sum(s.cached_prompt_tokens for s in on) > 0
    assert on_runner.computed == off_runner.computed - alloc.prefix_hits
    assert on_runner.computed < 0.6 * off_runner.computed
    for seq in on:  # whole blocks, and never the whole prompt
        assert seq.cached_prompt_tokens % BS == 0 and seq.cached_prompt_tokens < seq.prompt_len
    assert all(s.cached_prompt_tokens == 0 for s in off) and off_runner.allocator.prefix_hits == 0


def test_the_last_prompt_token_is_always_computed():
    runner = PrefixRunner()
    first, _ = _serve(runner, [[9] * 8, [8] * 9])
    again, _ = _serve(runner, [[9] * 8, [8] * 9])
    assert [s.cached_prompt_tokens for s in first] == [0, 0]
    assert [s.cached_prompt_tokens for s in again] == [4, 8]
    assert [s.generated for s in again] == [s.generated for s in first]


def test_a_tight_pool_evicts_and_preempts_and_still_answers_the_same():
    prompts = _shared_prompts(100, seed=1, size=(8, 24), suffix=(1, 8))
    roomy, _ = _serve(PrefixRunner(), prompts, prefix_cache=False, max_new_tokens=12)
    # 12 blocks of 4 tokens: about two sequences at a time
    tight_runner = PrefixRunner(blocks=12)
    tight, scheduler = _serve(tight_runner, prompts, max_new_tokens=12)
    assert [s.generated for s in tight] == [s.generated for s in roomy]
    assert scheduler.preemptions > 0 and scheduler.allocator.cache.evictions > 0
    assert scheduler.allocator.prefix_hits > 0


def test_a_preempted_sequence_reuses_its_own_blocks_when_it_comes_back():
    prompts = [[10 + i] * 6 for i in range(6)]  # nothing shared between them
    off_runner, on_runner = PrefixRunner(blocks=10), PrefixRunner(blocks=10)
    off, _ = _serve(off_runner, prompts, prefix_cache=False, max_new_tokens=10, per_step=6)
    on, scheduler = _serve(on_runner, prompts, max_new_tokens=10, per_step=6)
    assert [s.generated for s in on] == [s.generated for s in off]
    # no prompt shares a block with another: what is saved is what came back from preemption
    assert scheduler.preemptions > 0 and scheduler.allocator.prefix_hits == 0
    assert on_runner.computed < off_runner.computed


def test_blocks_with_another_image_are_not_reused():
    runner = PrefixRunner()
    rows = np.ones((2, 3), np.float32)
    tokens = [5, 6, 7, 8, 9, 10, 99, 99, 11, 12, 13, 14, 15]
    scheduler = Scheduler(runner)
    seqs = [Sequence(list(tokens), 2, images=ImageRows(np.array([6, 7]), rows * k))
            for k in (1, 2, 1)]
    for seq in seqs:
        scheduler.add(seq)
        list(scheduler.run())
    assert [s.cached_prompt_tokens for s in seqs] == [0, 4, 12]


# -- per-step cost ------------------------------------------------------------------------------
def _count(n: int, blocks: int) -> list[tuple[int, int]]:
    rng = np.random.default_rng(n)
    runner = PrefixRunner(blocks=blocks)
    scheduler = Scheduler(runner)
    systems = [rng.integers(3, 150, 8).tolist() for _ in range(3)]
    for i in range(n):
        scheduler.add(CountingSequence(systems[i % 3] + rng.integers(3, 150, 1 + i % 4).tolist(),
                                       3))
    steps = []
    CountingSequence.touches = 0
    while not scheduler.idle:
        before, preempted, parts = CountingSequence.touches, scheduler.preemptions, runner.parts
        scheduler.step()
        steps.append((CountingSequence.touches - before,
                      runner.parts - parts + scheduler.preemptions - preempted))
    assert scheduler.allocator.prefix_hits > 0
    return steps


@pytest.mark.parametrize("blocks", [10, 8000])
def test_each_step_still_costs_its_own_sequences(blocks):
    small, big = _count(100, blocks), _count(1000, blocks)
    assert all(t <= PER_SEQUENCE * (s + 1) for t, s in small + big)
    assert sum(t for t, _ in big) <= 11 * sum(t for t, _ in small)


# -- a real model -------------------------------------------------------------------------------
BLOCK_BYTES = 2 * 2 * 16 * 2 * 16 * 4  # layers x (k, v) x block 16 x kv heads 2 x head 16 x f32


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return compile_lm(tiny_lm("llama"), tmp_path_factory.mktemp("prefix") / "lm.dz")


def test_a_tiny_llama_answers_100_shared_prefix_requests_as_without_the_cache(artifact):
    prompts = _shared_prompts(100, seed=2)
    results = {}
    for name, memory, cache in [("off", None, False), ("on", None, True),
                                ("tight", 14 * BLOCK_BYTES, True)]:
        model = runtime.load(artifact, kv_cache_memory=memory)
        tokens = []
        scheduler_options = dict(max_batch_tokens=64, prefill_chunk=32)
        seqs, scheduler = _serve(_Counting(model.runner, tokens), prompts, cache, 4,
                                 **scheduler_options)
        results[name] = ([s.generated for s in seqs], sum(tokens), scheduler)
    off, on, tight = results["off"], results["on"], results["tight"]
    assert on[0] == off[0] and tight[0] == off[0]
    assert len({tuple(g) for g in off[0]}) > 50
    hits = on[2].allocator.prefix_hits
    assert hits > 0 and on[1] == off[1] - hits and on[1] < 0.6 * off[1]
    assert tight[2].preemptions > 0 and tight[2].allocator.cache.evictions > 0
    assert tight[2].allocator.prefix_hits > 0


class _Counting:
    """A StepRunner that adds up the tokens its steps compute."""

    def __init__(self, runner, tokens: list[int]):
        self.runner, self.tokens = runner, tokens
        self.spec, self.allocator = runner.spec, runner.allocator
        self.max_step_tokens = runner.max_step_tokens

    def run(self, parts):
        self.tokens.append(sum(len(p.tokens) for p in parts))
        return self.runner.run(parts)


def test_generate_reuses_a_cached_prompt_and_can_turn_it_off(artifact):
    model = runtime.load(artifact)
    ids = np.asarray(_shared_prompts(1, seed=3, size=(40, 40), suffix=(5, 5))[0])
    first = model.generate(ids, max_new_tokens=6, eos_token_id=[])
    assert model.stats.cached_tokens == 0 and model.stats.computed_tokens == 45 + 5
    again = model.generate(ids, max_new_tokens=6, eos_token_id=[])
    assert np.array_equal(again, first) and model.stats.cached_tokens == 32
    assert model.stats.computed_tokens == 45 - 32 + 5
    model.prefix_cache = False
    assert np.array_equal(model.generate(ids, max_new_tokens=6, eos_token_id=[]), first)
    assert model.stats.cached_tokens == 0 and model.stats.computed_tokens == 45 + 5
