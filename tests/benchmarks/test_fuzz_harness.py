"""benchmarks/fuzz.py, the long hostile-input fuzz: it runs the three fuzzers the suite runs
briefly, and exits non-zero when one misses its target."""

from __future__ import annotations

import pytest

from tests.benchmarks.scripts import benchmark_script


def test_an_unknown_fuzzer_is_a_usage_error(capsys):
    with benchmark_script("fuzz") as fuzz, pytest.raises(SystemExit) as exit_:
        fuzz.main(["--only", "artifacts,nosuch"])
    assert exit_.value.code == 2
    assert "unknown fuzzer(s) nosuch" in capsys.readouterr().err


def test_the_verdict_is_each_fuzzers_exit_code(monkeypatch, capsys, tmp_path):
    with benchmark_script("fuzz") as fuzz:
        assert set(fuzz.RUNNERS) == set(fuzz.FUZZERS)
        monkeypatch.setitem(fuzz.RUNNERS, "ir", lambda args: 0)
        monkeypatch.setitem(fuzz.RUNNERS, "http", lambda args: 1)
        assert fuzz.main(["--only", "ir", "--cases", "3", "--work", str(tmp_path)]) == 0
        assert fuzz.main(["--only", "ir,http", "--work", str(tmp_path)]) == 1
    assert "http MISSED" in capsys.readouterr().out
