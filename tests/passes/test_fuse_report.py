"""fusion_report: op counts before and after, how often each pattern fired, and why the
patterns tried fired nowhere."""

from __future__ import annotations

import re
from pathlib import Path

import compiler
from compiler.ir import parse_ir
from passes import PassManager
from passes.fusion.report import fusion_report, misses_of, not_fired, op_counts, records_of
from passes.fusion.sets import explain_fusion
from tests.passes import near_miss_model

CASES = Path(__file__).with_name("fuse_cases")
ROOT = Path(__file__).resolve().parents[2]
MODEL_FILE = "tests/passes/near_miss_model.py"


def test_report_lists_patterns_op_counts_and_groups():
    graph = parse_ir((CASES / "gelu_tanh.dzir").read_text())
    before = op_counts(graph)
    manager = PassManager("fuse,fuse_groups")
    graph = manager.run(graph)
    assert str(fusion_report(before, graph, records_of(manager))) == "\n".join([
        "fusion: 13 nodes -> 1 nodes",
        "patterns fired:",
        "  gelu_tanh                        1",
        "op counts:   op                            before   after",
        "             add                                2       0",
        "             constant                           5       0",
        "             gelu                               0       1",
        "             mul                                4       0",
        "             pow                                1       0",
        "             tanh                               1       0",
    ])


def test_report_counts_fusion_groups_and_takes_a_graph_as_before():
    text = (CASES / "rms.dzir").read_text()
    manager = PassManager("fuse{norms=false},fuse_groups")
    graph = manager.run(parse_ir(text))
    report = str(fusion_report(parse_ir(text), graph, records_of(manager)))
    assert report.splitlines()[1] == "patterns fired: none"
    assert report.splitlines()[-1] == "fusion groups: 1 kernels covering 6 nodes (largest 6)"


def test_explain_fusion_lists_every_candidate_rule():
    graph = parse_ir((CASES / "rms.dzir").read_text())
    verdicts = dict(explain_fusion(graph, "%n"))
    assert verdicts["rms_norm"] == "matches"
    assert verdicts["layer_norm"].startswith("%x is a graph input or weight, not ")
    assert "silu" in verdicts and verdicts["silu"] != "matches"


def test_report_says_why_a_pattern_tried_did_not_fire():
    """x * sigmoid(y) with y not x: silu and quick_gelu are tried at the mul, fire nowhere, and
    the report says where and why (the reason from the deepest point of each match)."""
    text = """graph main {
  input %x: f32[3, 8]
  input %y: f32[3, 8]
  %s: f32[3, 8] = sigmoid(%y)
  %out: f32[3, 8] = mul(%x, %s) loc("model.py:7")
  return %out
}
"""
    manager = PassManager("fuse")
    graph = manager.run(parse_ir(text))
    report = str(fusion_report(parse_ir(text), graph, records_of(manager), misses_of(manager)))
    assert _rule_block(report, "silu") == [
        "    1 x %y should be the same value as %x (both are 'x')",
        "        %out (mul) at model.py:7",
    ]
    assert _rule_block(report, "quick_gelu")[0] == "    1 x %y is a graph input or weight, not mul"


def _rule_block(report: str, rule: str) -> list[str]:
    """The lines under one rule's heading in the not-fired section of a text report."""
    lines = report.split("nearest misses first):\n")[1].split("\nop counts")[0].splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[0] == rule
                 and line.startswith("  ") and not line.startswith("   "))
    end = next((i for i in range(start + 1, len(lines))
                if not lines[i].startswith("   ")), len(lines))
    return lines[start + 1:end]


def _sigmoid_products(n: int) -> str:
    """n nodes `x * sigmoid(y_i)`: silu is tried at each and stops at each for the same reason."""
    lines = ["graph main {", "  input %x: f32[4]"]
    lines += [f"  input %y{i}: f32[4]" for i in range(n)]
    for i in range(n):
        lines += [f"  %s{i}: f32[4] = sigmoid(%y{i})",
                  f'  %m{i}: f32[4] = mul(%x, %s{i}) loc("model.py:{10 + i}")']
    lines += ["  return " + ", ".join(f"%m{i}" for i in range(n)), "}", ""]
    return "\n".join(lines)


def test_misses_are_grouped_by_reason_and_bounded():
    """Ten misses that differ only in value names are one group of ten: its first reason, the
    first three nodes, and a count of the rest (the report does not grow with the graph)."""
    text = _sigmoid_products(10)
    manager = PassManager("fuse")
    graph = manager.run(parse_ir(text))
    entries = {e.rule: e for e in not_fired(misses_of(manager), records_of(manager))}
    silu = entries["silu"]
    assert silu.tried == 10 and len(silu.groups) == 1 and silu.more_reasons == 0
    group = silu.groups[0]
    assert (group.count, group.reason) == (10, "%y0 should be the same value as %x (both are 'x')")
    assert [(e.anchor, e.loc) for e in group.examples] == [
        ("%m0 (mul)", "model.py:10"), ("%m1 (mul)", "model.py:11"), ("%m2 (mul)", "model.py:12")]
    report = str(fusion_report(parse_ir(text), graph, records_of(manager), misses_of(manager)))
    assert "    10 x %y0 should be the same value as %x (both are 'x')\n" in report
    assert "        ... and 7 more\n" in report


def test_near_misses_of_a_model_say_why_with_source_lines(monkeypatch):
    """A tanh GELU with a wrong constant and attention with its softmax over the queries: the two
    rules come first (nearest misses), each with the reason the match stopped and the source
    line it stopped at."""
    monkeypatch.chdir(ROOT)
    model, inputs = near_miss_model.build()
    graph = compiler.export(model, inputs)
    before = op_counts(graph)
    manager = PassManager("fuse")
    graph = manager.run(graph)
    report = fusion_report(before, graph, records_of(manager), misses_of(manager))
    assert [e.rule for e in report.not_fired[:2]] == ["attention", "gelu_tanh"]
    attention, gelu = report.not_fired[0].groups[0], report.not_fired[1].groups[0]
    assert attention.why() == "the pattern matched, but softmax over dim -2, not the key axis"
    assert attention.examples[0].code == "return torch.matmul(probs, v), g"
    assert attention.examples[0].loc == f"{MODEL_FILE}:17"
    assert re.fullmatch(r"%\w+ \(constant\) is the constant 0\.05, the pattern needs 0\.044715",
                        gelu.why())
    assert gelu.examples[0].code.startswith("g = 0.5 * x * (1.0 + torch.tanh(")
    text = str(report)
    assert (f"        {attention.examples[0].anchor} at {MODEL_FILE}:17: "
            "return torch.matmul(probs, v), g") in text.splitlines()


def test_report_leaves_out_patterns_that_fired_elsewhere():
    text = """graph main {
  input %x: f32[3, 8]
  input %y: f32[3, 8]
  %s: f32[3, 8] = sigmoid(%x)
  %a: f32[3, 8] = mul(%x, %s)
  %t: f32[3, 8] = sigmoid(%y)
  %b: f32[3, 8] = mul(%x, %t)
  return %a, %b
}
"""
    manager = PassManager("fuse")
    graph = manager.run(parse_ir(text))
    assert any(m.rule == "silu" and m.anchor == "%b (mul)" for m in misses_of(manager))
    report = str(fusion_report(parse_ir(text), graph, records_of(manager), misses_of(manager)))
    missed = report.split("nearest misses first):\n")[1].split("op counts")[0]
    assert "  silu " not in missed and "  quick_gelu " in missed
