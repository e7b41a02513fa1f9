"""The engine's own books: steps and their time by phase in /metrics, a step's greedy and
sampled rows each as the request alone, and a KV pool that is resident from start-up on (the
server's memory does not grow as load first reaches more blocks)."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.errors import InputError
from runtime.generation.scheduler import Scheduler, Sequence
from runtime.sampling import SamplingParams


def test_metrics_count_steps_their_tokens_and_the_engine_time(server):
    names = ["dayzero_steps_total", "dayzero_step_tokens_total", "dayzero_step_sequences_total",
             'dayzero_engine_seconds_total{phase="step"}',
             'dayzero_engine_seconds_total{phase="stream"}',
             'dayzero_engine_seconds_total{phase="idle"}']
    before = {n: server.metric(n) for n in names}
    answer = server.client().completions.create(model="lm.dz", prompt=[5, 6, 7, 8, 9],
                                                max_tokens=6, temperature=0)
    generated = answer.usage.completion_tokens
    after = {n: server.metric(n) for n in names}
    # alone: one step reads the prompt and gives the first token, then one step per token
    assert after["dayzero_steps_total"] - before["dayzero_steps_total"] == generated
    assert after["dayzero_step_tokens_total"] - before["dayzero_step_tokens_total"] == \
        5 + generated - 1
    assert after["dayzero_step_sequences_total"] - before["dayzero_step_sequences_total"] == \
        generated
    assert all(after[n] > before[n] for n in names[3:]), (before, after)


def test_greedy_and_sampled_rows_of_one_step_each_say_what_the_request_alone_says(reference):
    runner = reference.runner
    specs = [(SamplingParams(), None), (SamplingParams(True, 0.9, top_p=0.9), 3),
             (SamplingParams(), None), (SamplingParams(True, 1.3, top_k=5), 4)]

    def sequences():
        return [Sequence([7 + i, 11, 13 + i], 9, sampling,
                         rng=None if seed is None else np.random.default_rng(seed))
                for i, (sampling, seed) in enumerate(specs)]

    alone = []
    for seq in sequences():
        scheduler = Scheduler(runner)
        scheduler.add(seq)
        list(scheduler.run())
        alone.append(seq.generated)
    together = sequences()
    scheduler = Scheduler(runner)
    for seq in together:
        scheduler.add(seq)
    list(scheduler.run())
    assert [s.generated for s in together] == alone
    assert len({tuple(a) for a in alone}) == len(alone)  # the rows differ: a real mix


def test_the_served_kv_pool_is_resident_after_warm_up(artifact):
    import runtime
    from runtime.serving.engine import Engine
    from runtime.serving.metrics import Metrics

    model = runtime.load(artifact, kv_cache_memory="64MiB")
    engine = Engine(model, Metrics())
    engine.start()
    try:
        assert engine.ready.wait(60), engine.failure
        arrays = [array for pair in model.runner.cache.data for array in pair]
        pool = sum(array.nbytes for array in arrays)
        before = _rss()
        for array in arrays:  # what a load filling every block would write
            array.fill(1.0)
        grown = _rss() - before
        assert pool >= 60 * 2**20 and grown < pool / 8, (pool, grown)
    finally:
        engine.stop()


def test_a_failed_warm_up_is_reported_to_the_server_not_left_serving_503s(artifact):
    import runtime
    from runtime.serving.engine import Engine
    from runtime.serving.metrics import Metrics

    model = runtime.load(artifact, kv_cache_memory="64MiB")

    def broken(*args, **kwargs):
        raise RuntimeError("the step graph cannot run here")

    model.runner.run = broken
    engine = Engine(model, Metrics())
    told: list[str] = []
    engine.on_failure = told.append
    engine.start()
    engine.thread.join(60)
    assert not engine.thread.is_alive() and not engine.ready.is_set()
    assert engine.failure == "RuntimeError: the step graph cannot run here"
    assert told == [f"the model failed its warm-up generation: {engine.failure}"]


def _rss() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status
                    if line.startswith("VmRSS:"))


def test_a_steps_greedy_rows_pick_the_first_maximum_and_refuse_nan():
    logits = np.array([[0.0, 2.0, 2.0], [5.0, 1.0, 0.0], [0.0, 0.0, 3.0], [np.nan, 0.0, 9.0]],
                      np.float32)
    greedy = [Sequence([1], 4) for _ in range(3)]
    # rows out of order and the NaN row not asked for: picks as torch.argmax, no error
    assert Scheduler._sample([(greedy[0], 2), (greedy[1], 0), (greedy[2], 1)], logits) == \
        [2, 1, 0]
    with pytest.raises(InputError, match="contain NaN"):
        Scheduler._sample([(greedy[0], 0), (greedy[1], 3)], logits)
    with pytest.raises(InputError, match="contain NaN"):
        Scheduler._sample([(greedy[0], 0), (greedy[1], 1), (greedy[2], 2), (greedy[0], 3)],
                          logits)


def test_a_step_packs_no_more_tokens_than_the_step_graph_takes(reference):
    # the test artifact's step takes at most 256 tokens; its budget says 2048: three prompts
    # of 120 tokens arriving together must not share one step of 360
    assert reference.runner.max_step_tokens == 256
    assert Scheduler(reference.runner).budget == 256
    prompts = [[5 + (i + j) % 50 for j in range(120)] for i in range(3)]
    together = reference.generate(prompts, max_new_tokens=3)[:, 120:].tolist()
    assert together == [reference.generate([p], max_new_tokens=3)[0, 120:].tolist()
                        for p in prompts]
