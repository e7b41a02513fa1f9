"""benchmarks/peers.py's bookkeeping (not its timings): rounds, pairing, FLOP counting, the
roofline floor, the best peer, the report's columns and the cold-compile subprocess."""

from __future__ import annotations

import sys

import pytest

from tests.benchmarks.scripts import benchmark_script


@pytest.fixture(scope="module")
def peers():
    with benchmark_script("peers") as module:
        yield module


def test_every_round_times_every_peer_in_one_block(peers):
    calls = []
    a = peers.Peer("a", 0.0, lambda: calls.append("a"))
    b = peers.Peer("b", 0.0, lambda: calls.append("b"))
    idle = peers.Peer("unavailable", note="no onnxscript")
    peers.time_interleaved([a, b, idle], repeat=10, block=5, warmup=2, pause_s=0.0)
    assert len(a.times) == len(b.times) == 10 and not idle.times
    assert len(a.rounds) == len(b.rounds) == 2 and len(a.cpu_times) == 2  # one per block
    assert calls.count("a") == calls.count("b") == 14  # 2 rounds x (2 warm-up + 5 timed)
    # a block is contiguous: a peer's calls are never interleaved with another's inside a round
    runs = [calls[i] for i in range(len(calls)) if i == 0 or calls[i] != calls[i - 1]]
    assert len(runs) == 4


def test_paired_ratio_pairs_rounds_not_pooled_times(peers):
    fast, slow = peers.Peer("fast"), peers.Peer("slow")
    # the machine slows down 3x between rounds; each pair still says 0.8
    fast.rounds, slow.rounds = [0.8, 2.4, 1.6, 4.0], [1.0, 3.0, 2.0, 5.0]
    median, q1, q3 = peers.paired_ratio(fast, slow)
    assert median == pytest.approx(0.8) and q1 == pytest.approx(0.8) and q3 == pytest.approx(0.8)
    fast.rounds = [0.7, 3.0, 1.6, 4.0]  # ratios 0.7, 1.0, 0.8, 0.8
    median, q1, q3 = peers.paired_ratio(fast, slow)
    assert (median, q1, q3) == pytest.approx((0.8, 0.775, 0.85))
    assert peers.paired_ratio(peers.Peer("x", rounds=[1.0]), peers.Peer("y", rounds=[1.0])) is None


# -- FLOP counting and the roofline floor: exact numbers on small graphs ------------------------

def _flops(peers, text, shapes, **kw):
    from compiler.ir import parse_ir

    return peers.matmul_flops(parse_ir(text), shapes, **kw)


def test_causal_pairs_is_the_lower_triangle(peers):
    assert peers.causal_pairs(1, 1) == 1
    assert peers.causal_pairs(4, 4) == 10  # S(S+1)/2
    assert peers.causal_pairs(128, 128) == 8256
    assert peers.causal_pairs(2, 5) == 1 + 2  # query i sees keys 0..i (top-left, as torch)
    assert peers.causal_pairs(5, 2) == 1 + 2 + 2 + 2 + 2


LINEAR = """graph main {
  symbol s0 in [2, 64]
  input %x: f32[2, s0, 32]
  weight @w: f32[16, 32]
  weight @b: f32[16]
  %y: f32[2, s0, 16] = linear(%x, @w, @b)
  return %y
}"""

MATMUL = """graph main {
  input %a: f32[3, 4, 8]
  input %b: f32[3, 8, 6]
  %y: f32[3, 4, 6] = matmul(%a, %b)
  return %y
}"""

CONV = """graph main {
  input %x: f32[1, 3, 8, 8]
  weight @w: f32[4, 3, 3, 3]
  %y: f32[1, 4, 6, 6] = conv(%x, @w, _) ATTRS
  return %y
}""".replace("ATTRS", "{stride=[1, 1], padding=[0, 0], dilation=[1, 1], groups=1}")

SDPA = """graph main {
  symbol s0 in [2, 64]
  input %q: f32[1, 2, s0, 8]
  input %k: f32[1, 2, s0, 8]
  input %v: f32[1, 2, s0, 8]
  %y: f32[1, 2, s0, 8] = scaled_dot_product_attention(%q, %k, %v, _) ATTRS
  return %y
}""".replace("ATTRS", "{is_causal=CAUSAL, scale=none, enable_gqa=false, window=none, "
                   "softcap=none}")

HEADS = """graph main {
  symbol s0 in [1, 64]
  input %q: f32[1, s0, 64]
  input %k: f32[1, s0, 32]
  input %v: f32[1, s0, 32]
  input %cos: f32[1, 1, s0, 16]
  input %sin: f32[1, 1, s0, 16]
  %out: f32[1, s0, 64] = multi_head_attention(%q, %k, %v, %cos, %sin, _) ATTRS
  return %out
}""".replace("ATTRS", "{num_heads=4, kv_num_heads=2, scale=0.25, is_causal=true}")


def test_matmul_flops_linear_matmul_conv(peers):
    # 2 x (output elements) x (reduced size); the symbol s0 bound from the input's shape
    assert _flops(peers, LINEAR, [(2, 5, 32)]) == 2 * (2 * 5 * 16) * 32 == 10240
    assert _flops(peers, MATMUL, [(3, 4, 8), (3, 8, 6)]) == 2 * (3 * 4 * 6) * 8 == 1152
    assert _flops(peers, CONV, [(1, 3, 8, 8)]) == 2 * (4 * 6 * 6) * (3 * 3 * 3) == 7776


def test_matmul_flops_counts_half_of_causal_attention(peers):
    shapes = [(1, 2, 4, 8)] * 3
    # q k^T and probs v: 2 x head size each, per (batch, head, query, key) pair
    dense = _flops(peers, SDPA.replace("CAUSAL", "false"), shapes)
    assert dense == 2 * 2 * 16 * (8 + 8) == 1024
    causal = SDPA.replace("CAUSAL", "true")
    assert _flops(peers, causal, shapes) == 2 * 2 * 10 * (8 + 8) == 640  # 10 = 4 * 5 / 2
    assert _flops(peers, causal, shapes, causal_half=False) == 1024


def test_matmul_flops_sees_attention_inside_fused_heads(peers):
    # multi_head_attention is counted through its decomposition: 4 heads of size 16, s0 = 6
    shapes = [(1, 6, 64), (1, 6, 32), (1, 6, 32), (1, 1, 6, 16), (1, 1, 6, 16)]
    assert _flops(peers, HEADS, shapes) == 2 * 4 * 21 * (16 + 16) == 5376  # 21 = 6 * 7 / 2
    assert _flops(peers, HEADS, shapes, causal_half=False) == 2 * 4 * 36 * (16 + 16) == 9216


def test_roofline_floor_is_flops_over_rate(peers):
    assert peers.roofline_ms(10**9, 200e9) == pytest.approx(5.0)
    assert peers.roofline_ms(4_305_000_000, 221e9) == pytest.approx(19.48, abs=0.01)


# -- the best peer, the report and the cold compile ---------------------------------------------

def _timed_peer(peers, name, ms, dayzero=False, **extra):
    import numpy as np

    p = peers.Peer(name, 1.0, lambda: None, np.zeros(2), dayzero=dayzero, extra=extra)
    p.times, p.cpu_times = [ms / 1e3] * 4, [ms / 1e3] * 2
    p.rounds = [ms / 1e3] * 2
    return p


def test_best_peer_is_the_fastest_that_is_not_dayzero(peers):
    eager = _timed_peer(peers, "eager", 10.0)
    ort = _timed_peer(peers, "torch.onnx.export+ORT", 6.0)
    opt = _timed_peer(peers, "torch.onnx.export+ORT optimizer", 5.0)
    dz = _timed_peer(peers, "dayzero", 4.0, dayzero=True)
    missing = peers.Peer("torch.compile", note="unavailable")
    assert peers.best_peer([eager, missing, ort, opt, dz]) is opt
    assert peers.best_peer([dz, missing]) is None


def test_report_gives_ratios_to_the_best_peer_and_names_the_attention_kernels(peers):
    eager = _timed_peer(peers, "eager", 10.0)
    ort = _timed_peer(peers, "torch.onnx.export+ORT", 6.0,
                      contrib=["com.microsoft.GroupQueryAttention"])
    opt = _timed_peer(peers, "torch.onnx.export+ORT optimizer", 5.0, model_type="qwen3",
                      fused={"SkipSimplifiedLayerNormalization": 8})
    dz = _timed_peer(peers, "dayzero", 4.0, dayzero=True, flops=10**9, flops_full=2 * 10**9,
                     contrib=["ai.dayzero.CausalAttention"], pipeline="fuse")
    plain = _timed_peer(peers, "dayzero, no native kernels", 4.5, dayzero=True,
                        contrib=["com.microsoft.GroupQueryAttention"])
    dz.cold_compile_s = 2.5
    text = peers.report("decoder-128", [eager, ort, opt, dz, plain], rate=200e9)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in text.splitlines() if line.startswith("| ") and "---" not in line}
    assert rows["dayzero"][:2] == ["2.50", "1.00"]  # cold, then in process
    assert rows["dayzero"][6] == "0.80x" and rows["eager"][6] == "2.00x"  # vs the optimizer's 5 ms
    assert "model_type qwen3, SkipSimplifiedLayerNormalization x8" in rows[
        "torch.onnx.export+ORT optimizer"][-1]
    assert "best peer (fastest median that is not dayzero): torch.onnx.export+ORT optimizer" in text
    assert "1.000 GFLOP" in text and "2.000 GFLOP with the full" in text and "= 5.00 ms" in text
    assert "ai.dayzero.CausalAttention (dayzero): skips the masked half" in text
    assert ("com.microsoft.GroupQueryAttention (torch.onnx.export+ORT, dayzero, no native "
            "kernels): computes the full S x S") in text
    assert "dayzero over torch.onnx.export+ORT optimizer, round by round: median 0.80x" in text
    assert "4.00 ms against 4.50 ms without them (0.89x; round by round 0.89x)" in text


def test_cold_compile_reads_the_last_line_of_a_fresh_process(peers):
    script = "print('import noise'); print('{\"compile_s\": 1.5, \"note\": \"\"}')"
    assert peers.cold_compile("w", "p", {}, [sys.executable, "-c", script]) == (1.5, "")
    took, why = peers.cold_compile("w", "p", {}, [sys.executable, "-c",
                                                  "raise SystemExit('no model')"])
    assert took is None and why == "cold compile failed: no model"


def test_cold_compile_entry_point_compiles_in_its_own_process(peers, monkeypatch, capsys):
    import json

    import torch

    def tiny():
        torch.manual_seed(0)
        return torch.nn.Linear(8, 4).eval(), (torch.randn(2, 8),), None

    monkeypatch.setitem(peers.WORKLOADS, "tiny", tiny)
    session = json.dumps({"intra_op_threads": 1, "allow_spinning": False})
    threads = torch.get_num_threads()
    try:  # the entry point sets the thread count of what is meant to be its own process
        assert peers.main(["--cold-compile", "tiny", "dayzero", "--session", session]) == 0
    finally:
        torch.set_num_threads(threads)
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["compile_s"] > 0 and result["note"] == ""
