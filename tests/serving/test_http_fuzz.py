"""300 seeded fuzzed bodies (benchmarks/fuzz_http.py) against a real `dayzero serve`: no 500,
every answer a completion or an error in OpenAI's shape, every request answered, /health fast
throughout, and the server healthy with every KV block free afterwards."""

from __future__ import annotations

from tests.benchmarks.scripts import benchmark_script

CASES = 300


def test_fuzzed_bodies_never_get_a_500_and_health_stays_fast(server):
    with benchmark_script("fuzz_http") as fuzz:
        report = fuzz.run(server.url, CASES, seed=33)
    summary = "\n".join(report.lines())
    assert sum(report.statuses.values()) == CASES, summary
    assert report.server_errors == 0 and not report.bad, summary
    assert not report.transport, summary
    # the mix reaches the server's every answer, not only its JSON check
    assert {200, 400, 413} <= set(report.statuses), summary
    assert report.health_failures == 0 and len(report.health) >= 10, summary
    assert report.health_quantile(0.99) < 2.0, summary
    assert server.get("/health")[0] == 200
    assert server.metric("dayzero_kv_blocks_used") == 0


def test_the_judge_refuses_what_is_not_openais():
    with benchmark_script("fuzz_http") as fuzz:
        case = fuzz.Case("/v1/completions", b"{}", {}, "test")
        assert fuzz.judge(case, 500, b'{"error": {"message": "x", "type": "y"}}', "") \
            == "status 500"
        assert "not in OpenAI's error shape" in fuzz.judge(case, 405, b'{"detail": "x"}', "")
        assert "not JSON" in fuzz.judge(case, 400, b"Internal Server Error", "")
        assert fuzz.judge(case, 400, b'{"error": {"message": "m", "type": "t"}}', "") is None
        stream = b'data: {"choices": []}\n\ndata: [DONE]\n\n'
        assert fuzz.judge(case, 200, stream, "text/event-stream") is None
        assert "without [DONE]" in fuzz.judge(case, 200, stream[:-16], "text/event-stream")
