"""benchmarks/serve.py's bookkeeping (not its timings): percentiles, the seeded request mix,
per-run summaries and errors by status, the verdict lines, Prometheus parsing, the streamed
response reader, and the static-batch helpers."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from tests.benchmarks.scripts import benchmark_script


@pytest.fixture(scope="module")
def bench():
    with benchmark_script("serve") as module:
        yield module


def test_percentiles_interpolate_like_numpy(bench):
    import numpy as np

    for values in ([5.0], [3.0, 1.0], [1, 2, 3, 4, 10], list(range(101)), [0.2, 7.5, 1.1, 9.0]):
        for q in (0, 50, 90, 99, 100):
            assert bench.percentile(values, q) == pytest.approx(np.percentile(values, q))
    assert math.isnan(bench.percentile([], 50))


def test_the_request_mix_is_seeded_and_bounded(bench):
    mix = bench.request_mix(40, seed=3, max_positions=4160, max_tokens=(16, 64))
    assert mix == bench.request_mix(40, seed=3, max_positions=4160, max_tokens=(16, 64))
    assert mix != bench.request_mix(40, seed=4, max_positions=4160, max_tokens=(16, 64))
    assert [r.index for r in mix] == list(range(40))
    long = [r for r in mix if len(r.prompt) >= 1000]
    assert len(long) == 4  # round(40 * 0.1): a few long documents, the rest short chats
    assert all(1000 <= len(r.prompt) <= 2000 for r in long)
    assert all(16 <= len(r.prompt) <= 128 for r in mix if r not in long)
    assert all(16 <= r.max_tokens <= 64 for r in mix)
    assert all(3 <= t < 32000 for r in mix for t in r.prompt)


def test_the_request_mix_fits_a_small_context(bench):
    mix = bench.request_mix(10, seed=0, max_positions=600, max_tokens=(8, 32), long_fraction=0.5)
    assert all(len(r.prompt) + r.max_tokens <= 600 for r in mix)
    assert sum(len(r.prompt) == 600 - 32 for r in mix) == 5  # documents cut to the context
    with pytest.raises(ValueError, match="no room"):
        bench.request_mix(4, seed=0, max_positions=40, max_tokens=(8, 32))


def _outcome(bench, index=0, status=200, first=0.5, n=5, gap=0.02, **kw):
    stamps = [10.0 + first + gap * i for i in range(n)]
    base = dict(status=status, prompt_tokens=10, start=10.0, stamps=stamps,
                tokens=list(range(100, 100 + n)), finish_reason="length")
    base.update(kw)
    return bench.Outcome(index, **base)


def test_a_summary_splits_errors_by_status_and_times_each_request(bench):
    outcomes = [_outcome(bench, 0, first=0.1, gap=0.01),
                _outcome(bench, 1, first=0.3, gap=0.03),
                _outcome(bench, 2, status=429, stamps=[], tokens=[], finish_reason=None),
                _outcome(bench, 3, status=429, stamps=[], tokens=[], finish_reason=None),
                _outcome(bench, 4, status=0, stamps=[], tokens=[], finish_reason=None,
                         error="ConnectError: refused"),
                _outcome(bench, 5, n=2, finish_reason=None, error="the step failed"),
                _outcome(bench, 6, n=3, finish_reason=None, cancelled=True)]
    s = bench.summarize(outcomes, wall=2.0)
    assert s.requests == 7 and s.completed == 2 and s.cancelled == 1
    assert s.busy == 2 and s.errors == {"stream": 1, "transport": 1}  # 429s apart
    assert s.tokens == 5 + 5 + 2 + 3 and s.tokens_per_s == pytest.approx(7.5)
    assert s.prompt_tokens_per_s == pytest.approx(4 * 10 / 2.0)  # the 429s read none
    # TTFT over every answered request (0.1, 0.3, 0.5, 0.5); TPOT over the completed ones
    assert s.ttft_p50 == pytest.approx(0.4) and s.tpot_p50 == pytest.approx(0.02)
    assert s.tpot_p99 == pytest.approx(0.0298)
    line = bench.summary_line("c=8", s)
    assert "429s 2" in line and "stream: 1, transport: 1" in line and "7.5 tok/s" in line
    assert "cancelled 1" in line and "MISSING" not in line


def test_a_stream_that_lost_token_ids_is_flagged(bench):
    o = _outcome(bench, 0, n=3, usage_tokens=4)
    assert o.lost_ids
    assert not _outcome(bench, 0, n=3, usage_tokens=3).lost_ids
    assert "STREAMS MISSING TOKEN IDS 1" in bench.summary_line(
        "c=1", bench.summarize([o], 1.0))


def test_verdicts_against_one_request_at_a_time(bench):
    met = bench.verdicts(400.0, 50.0, 0.030, 0.020)
    assert "8.00x single" in met[0] and met[0].endswith("met")
    assert "1.50x single decode" in met[1] and met[1].endswith("met")
    missed = bench.verdicts(150.0, 50.0, 0.050, 0.020)
    assert "3.00x" in missed[0] and missed[0].endswith("MISSED")
    assert "2.50x" in missed[1] and missed[1].endswith("MISSED")


def test_answers_are_compared_token_by_token(bench):
    assert bench.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert bench.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert bench.first_divergence([1, 2], [1, 2, 3]) == 2
    outcomes = [_outcome(bench, 0, n=3), _outcome(bench, 1, n=3),
                _outcome(bench, 2, n=3, cancelled=True, finish_reason=None)]
    reference = {0: [100, 101, 102], 1: [100, 101, 7], 2: [9]}
    assert bench.mismatches(outcomes, reference) == [(1, 2)]  # a cancelled one is not compared


def test_the_servers_metrics_parse(bench):
    from runtime.serving.metrics import Metrics

    m = Metrics()
    m.kv_used.set(3)
    m.kv_free.set(61)
    m.finished.labels("cancelled").inc(2)
    m.finished.labels("length").inc(5)
    m.requests.labels("/v1/completions", "429").inc()
    m.ttft.observe(0.2)
    samples = bench.parse_metrics(m.render()[0].decode())
    assert bench.metric(samples, "dayzero_kv_blocks_used") == 3
    assert bench.metric(samples, "dayzero_kv_blocks_free") == 61
    assert bench.metric(samples, "dayzero_sequences_finished_total", reason="cancelled") == 2
    assert bench.metric(samples, "dayzero_sequences_finished_total") == 7
    assert bench.metric(samples, "dayzero_requests_total", status="429") == 1
    assert bench.metric(samples, "dayzero_time_to_first_token_seconds_count") == 1
    assert bench.metric(samples, "dayzero_preemptions_total") == 0
    assert bench.metric(samples, "no_such_metric") == 0
    text = 'x{a="q\\"uote",b="2"} 1.5e3\n# HELP x y\nplain 4\n'
    assert bench.parse_metrics(text) == {("x", (("a", 'q\\"uote'), ("b", "2"))): 1500.0,
                                         ("plain", ()): 4.0}


def test_the_engine_line_shares_the_wall_time_by_phase(bench):
    from runtime.serving.metrics import Metrics

    m = Metrics()
    before = bench.parse_metrics(m.render()[0].decode())
    m.steps.inc(40)
    m.step_sequences.inc(300)
    m.step_tokens.inc(1000)
    for phase, seconds in (("step", 2.0), ("stream", 0.5), ("commands", 0.1), ("idle", 1.4)):
        m.engine_seconds.labels(phase).inc(seconds)
    line = bench.engine_line(before, bench.parse_metrics(m.render()[0].decode()), 4.0)
    assert line == ("  engine: 40 steps of 7.5 sequences and 25 tokens, 50.0 ms each; of the "
                    "wall time: step 50%, stream 12%, commands 2%, idle 35%")
    assert bench.engine_line(before, before, 4.0) == "  engine: no steps"


def test_the_rss_check_allows_five_percent(bench):
    assert bench.rss_verdict(1000 << 20, 1040 << 20).endswith("met")
    line = bench.rss_verdict(1000 << 20, 1060 << 20)
    assert "+6.0%" in line and line.endswith("MISSED")


def _sse(*chunks) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) \
        + b"data: [DONE]\n\n"


def _chunk(ids, reason=None):
    return {"object": "text_completion", "choices": [
        {"index": 0, "text": " ".join(f"t{i}" for i in ids), "finish_reason": reason,
         "token_ids": ids}]}


def _run_stream(bench, body: bytes, status=200, cancel_after=None):
    httpx = bench._httpx()
    seen = []

    def handler(request):
        seen.append(json.loads(request.content))
        return httpx.Response(status, content=body,
                              headers={"content-type": "text/event-stream"})

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler),
                                     base_url="http://127.0.0.1:1") as client:
            return await bench.stream_one(client, "m", bench.Req(7, (5, 6, 7), 4), cancel_after)

    return asyncio.run(go()), seen


def test_a_stream_is_read_into_token_ids_and_times(bench):
    usage = {"object": "text_completion", "choices": [],
             "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}
    out, seen = _run_stream(bench, _sse(_chunk([11]), _chunk([12, 13]), _chunk([14], "length"),
                                        usage))
    assert seen[0]["prompt"] == [5, 6, 7] and seen[0]["temperature"] == 0
    assert seen[0]["stream"] is True and seen[0]["stream_options"] == {"include_usage": True}
    assert out.index == 7 and out.status == 200 and out.completed and out.prompt_tokens == 3
    assert out.tokens == [11, 12, 13, 14] and len(out.stamps) == 4 and out.ttft >= 0
    assert out.usage_tokens == 4 and not out.lost_ids
    out, _ = _run_stream(bench, _sse(_chunk([11]), _chunk([12]), _chunk([13])), cancel_after=2)
    assert out.cancelled and out.tokens == [11, 12] and not out.completed
    assert bench.error_kind(out) is None
    out, _ = _run_stream(bench, b'{"error": {"message": "busy"}}', status=429)
    assert out.status == 429 and bench.error_kind(out) == "429"
    out, _ = _run_stream(bench, _sse(_chunk([11]), {"error": {"message": "step failed"}}))
    assert bench.error_kind(out) == "stream" and out.error == "step failed"


def test_static_batches_pad_left_and_count_only_what_each_row_asked_for(bench):
    ids, mask = bench.pad_left([(5, 6, 7), (8,)], 0)
    assert ids == [[5, 6, 7], [0, 0, 8]] and mask == [[1, 1, 1], [0, 0, 1]]
    assert bench.useful_tokens([9, 9, 9, 9], 3) == 3
    assert bench.useful_tokens([9, 2, 0, 0], 3) == 2   # up to and including EOS
    assert bench.useful_tokens([9, 9], 5) == 2
    reqs = bench.request_mix(19, 0, 600, (4, 8), long_fraction=0)
    assert [len(b) for b in bench.batches(reqs, 8)] == [8, 8, 3]
