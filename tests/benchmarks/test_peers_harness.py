"""benchmarks/peers.py's bookkeeping (not its timings): rounds, pairing, FLOP counting."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def peers():
    spec = importlib.util.spec_from_file_location("bench_peers", ROOT / "benchmarks" / "peers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


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
