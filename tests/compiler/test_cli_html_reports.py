"""`dayzero coverage --html` and `dayzero compile --report --html`: one self-contained page
each, with what the text report says."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from compiler.cli import main
from tests.compiler.conftest import MLP

LLAMA = MLP.replace("mlp.py", "llama.py")


def _self_contained(page: str) -> None:
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    assert "<script" not in page and not re.search(r'(src|href)="(?!#)', page)


def test_coverage_html_colors_each_verdict(tmp_path, capsys):
    out = tmp_path / "coverage.html"
    assert main(["coverage", MLP, "--backend", "onnxruntime", "--backend", "reference",
                 "--html", str(out)]) == 0
    text = capsys.readouterr().out
    page = out.read_text()
    _self_contained(page)
    for op in ("linear", "gelu", "layer_norm"):
        assert f"<td>{op}</td>" in page and op in text
    assert page.count('<td class="ok">yes</td>') >= 6  # every op, on both backends
    assert "every op runs on at least one backend" in page


def test_compile_report_html_shows_fired_patterns_and_counts(tmp_path, capsys):
    out = tmp_path / "fusion.html"
    assert main(["compile", LLAMA, "-o", str(tmp_path / "m.dz"), "--report", "--html",
                 str(out)]) == 0
    printed = capsys.readouterr().out
    page = out.read_text()
    _self_contained(page)
    fired = re.findall(r"^  (\w+)\s+(\d+)$", printed.split("patterns fired:")[1], re.M)
    assert fired
    for rule, count in fired:
        assert f"<tr><td>{rule}</td><td class=\"num\">{count}</td></tr>" in page
    nodes = re.search(r"fusion: (\d+) nodes -> (\d+) nodes", printed).group(0)
    assert html.escape(nodes) in page and "<svg" in page


NEAR_MISSES = f"{Path(__file__).resolve().parents[1]}/passes/near_miss_model.py:build"


def test_compile_report_says_why_patterns_did_not_fire_in_text_and_html(tmp_path, capsys):
    """The near misses of tests/passes/near_miss_model.py (attention with its softmax over the
    queries, a GELU with a wrong constant): the text and the page give the same reasons, with
    the source line each reason stopped at."""
    out = tmp_path / "fusion.html"
    assert main(["compile", NEAR_MISSES, "-o", str(tmp_path / "m.dz"), "--report", "--html",
                 str(out)]) == 0
    printed = capsys.readouterr().out
    page = out.read_text()
    _self_contained(page)
    why = "the pattern matched, but softmax over dim -2, not the key axis"
    assert f"    1 x {why}\n" in printed
    constant = re.search(r"    1 x (%\w+ \(constant\) is the constant 0\.05, the pattern needs "
                         r"0\.044715)\n", printed).group(1)
    for reason in (why, constant):
        assert f"<td>{html.escape(reason)}</td>" in page
    assert f"<td>{html.escape('return torch.matmul(probs, v), g')}</td>" in page


@pytest.mark.parametrize("argv, message", [
    (["--html", "x.html"], "it needs --report"),
    (["--report", "--html", "/nonexistent/dir/x.html"], "not writable"),
])
def test_html_without_report_or_writable_folder_is_refused(tmp_path, capsys, argv, message):
    assert main(["compile", MLP, "-o", str(tmp_path / "m.dz"), *argv]) != 0
    assert message in capsys.readouterr().err
    assert not (tmp_path / "m.dz").exists()
