"""benchmarks/generate.py's bookkeeping (not its timings): token stamps to TTFT and decode
rates, the target verdicts, the child's result line, prompts and the decode weight bytes."""

from __future__ import annotations

import pytest

from tests.benchmarks.scripts import benchmark_script


@pytest.fixture(scope="module")
def bench():
    with benchmark_script("generate") as module:
        yield module


def test_decode_figures_split_the_first_token_from_the_decode_rate(bench):
    # batch 1: first token at 0.5 s, then one every 20 ms
    stamps = [10.5 + 0.02 * i for i in range(5)]
    ttft, per_token, rate = bench.decode_figures(stamps, 10.0, 1, 5)
    assert ttft == pytest.approx(500) and per_token == pytest.approx(20)
    assert rate == pytest.approx(50)
    # batch 2: both first tokens by 0.6 s; then each step gives two tokens every 25 ms
    stamps = [10.5, 10.6] + [10.6 + 0.025 * (i // 2 + 1) for i in range(6)]
    ttft, per_token, rate = bench.decode_figures(stamps, 10.0, 2, 4)
    assert ttft == pytest.approx(500) and rate == pytest.approx(80)
    assert per_token == pytest.approx(25)


def test_a_target_is_met_against_the_larger_of_peer_and_floor(bench):
    assert "meets" in bench.ratio_line("decode", 19.0, 24.0, 20.0, 0.9, 1.1)   # 0.79x peer
    assert "meets" in bench.ratio_line("decode", 21.0, 20.0, 20.0, 0.9, 1.1)   # 1.05x floor
    line = bench.ratio_line("decode", 30.0, 24.0, 20.0, 0.9, 1.1)
    assert "MISSES" in line and "1.25x best peer" in line and "1.50x floor" in line


def test_the_child_result_line_round_trips(bench):
    result = bench.Result("dayzero", 512, 1, 100.0, 20.0, 50.0, 1 << 20, 1 << 30)
    import json

    text = "log line\n" + json.dumps(result.__dict__) + "\n"
    assert bench.Result.parse(text) == result
    with pytest.raises(ValueError, match="no result line"):
        bench.Result.parse("Traceback ...\n")


def test_prompts_are_reproducible_and_avoid_special_tokens(bench):
    a = bench.prompts(3, 16, 100)
    assert a == bench.prompts(3, 16, 100) and len(a) == 3 and len(a[0]) == 16
    assert min(min(p) for p in a) >= 3 and a[0] != a[1]


def test_decode_reads_every_matrix_but_one_embedding_row(bench, tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    save_file({"model.embed_tokens.weight": np.zeros((100, 8), np.float32),
               "model.layers.0.mlp.up_proj.weight": np.zeros((16, 8), np.float32),
               "model.norm.weight": np.zeros(8, np.float32),
               "lm_head.weight": np.zeros((100, 8), np.float32)}, tmp_path / "m.safetensors")
    read, params = bench.weight_bytes(tmp_path)
    assert read == (8 + 16 * 8 + 8 + 100 * 8) * 4
    assert params == 16 * 8  # lm_head: only the last prompt token goes through it


def test_int4_rows_name_their_block_size_and_print_their_config(bench):
    assert bench.int4_peer(32) == "dayzero-int4" and bench.int4_peer(128) == "dayzero-int4-g128"
    assert bench.int4_config(64) == "quantize: {weights: int4, group_size: 64, activations: int8}"


def test_logit_error_figures():
    import numpy as np

    with benchmark_script("logit_error") as errors:
        ref = np.array([[3.0, 4.0, 0.0], [0.0, 0.0, 1.0]])
        got = np.array([[3.0, 4.0, 1.0], [0.0, 2.0, 1.0]])  # error norm sqrt(5), ref norm sqrt(26)
        e = errors.error_figures(ref, got)
        assert e["rel_rms"] == np.sqrt(5 / 26) and e["max_abs"] == 2.0 and e["top1"] == 0.5
        got[0, 0] = np.nan
        assert np.isnan(errors.error_figures(ref, got)["rel_rms"])


def _result(bench, peer: str, ttft: float, decode: float, rss: int = 1):
    return bench.Result(peer, 128, 1, ttft, decode, 1e3 / decode, 0, rss)


def test_rounds_take_turns_and_report_each_peers_median(bench, monkeypatch):
    calls = []
    times = {"a": iter([10.0, 30.0, 20.0]), "b": iter([5.0, 50.0, 40.0])}

    def measure(peer, path, context, new, batch):
        calls.append(peer)
        decode = next(times[peer])
        return _result(bench, peer, 2 * decode, decode, rss=int(decode))

    monkeypatch.setattr(bench, "measure", measure)
    medians, runs = bench.measure_rounds({"a": ("a", "A", 1), "b": ("b", "B", 1)}, 128, 64, 3)
    assert calls == ["a", "b"] * 3  # the peers alternate round by round
    assert medians["a"].decode_ms == 20.0 and medians["a"].ttft_ms == 40.0
    assert medians["b"].decode_ms == 40.0 and medians["b"].peak_rss == 50  # the highest
    assert [r.decode_ms for r in runs["b"]] == [5.0, 50.0, 40.0]
    # each round against that round's best peer: 10/5, 30/50, 20/40
    assert bench.round_ratios(runs["a"], [runs["b"]]) == "  per round: 2.00x, 0.60x, 0.50x"


def test_a_peer_that_fails_is_reported_and_not_rerun(bench, monkeypatch):
    calls = []

    def measure(peer, path, context, new, batch):
        calls.append(peer)
        return "timed out after 1800 s" if peer == "b" else _result(bench, peer, 1.0, 1.0)

    monkeypatch.setattr(bench, "measure", measure)
    medians, runs = bench.measure_rounds({"a": ("a", "A", 1), "b": ("b", "B", 1)}, 128, 64, 3)
    assert medians["b"] == "timed out after 1800 s" and runs["b"] == []
    assert calls.count("b") == 1 and calls.count("a") == 3


def test_batch_8_runs_in_the_rounds_under_its_own_label_and_is_compared_round_by_round(
        bench, monkeypatch):
    calls = []
    rates = iter([50.0, 260.0, 40.0, 210.0])  # round 1: 5.2x, round 2: 5.25x

    def measure(peer, path, context, new, batch):
        calls.append((peer, batch))
        rate = next(rates)
        return bench.Result(peer, context, batch, 1.0, 1e3 * batch / rate, rate, 0, 1)

    monkeypatch.setattr(bench, "measure", measure)
    jobs = {"dayzero": ("dayzero", "D", 1), bench.BATCH8: ("dayzero", "D", 8)}
    medians, runs = bench.measure_rounds(jobs, 128, 64, 2)
    assert calls == [("dayzero", 1), ("dayzero", 8)] * 2
    assert medians[bench.BATCH8].batch == 8 and medians["dayzero"].tokens_per_s == 45.0
    # each round against its own batch 1, not the medians (235 / 45 = 5.22)
    assert bench.batch_ratios(runs[bench.BATCH8], runs["dayzero"]) == [5.2, 5.25]
