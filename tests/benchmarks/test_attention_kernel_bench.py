"""benchmarks/attention_kernel.py runs both kernels on the same inputs and they agree (its
timings are not checked: they belong to the machine)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_both_kernels_run_and_agree(capsys, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_attention",
                                                  ROOT / "benchmarks" / "attention_kernel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "PAUSE_S", 0.0)
    monkeypatch.setattr(module, "WARM_S", 0.0)
    assert module.main(["--seq", "20", "33", "--threads", "1", "--rounds", "1"]) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [("20", "1"), ("33", "1")]
    assert all(float(r[5]) < 1e-5 for r in rows)  # CausalAttention agrees with GQA
