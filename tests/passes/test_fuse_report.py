"""fusion_report: op counts before and after, and how often each pattern fired."""

from __future__ import annotations

from pathlib import Path

from compiler.ir import parse_ir
from passes import PassManager
from passes.fusion.report import fusion_report, misses_of, op_counts, records_of
from passes.fusion.sets import explain_fusion

CASES = Path(__file__).with_name("fuse_cases")


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
    lines = str(fusion_report(parse_ir(text), graph, records_of(manager), misses_of(manager)))
    lines = lines.splitlines()
    start = lines.index("patterns tried that did not fire (first node tried, and why it did not "
                        "match):")
    tried = {line.split()[0]: line for line in lines[start + 1:] if line.startswith("  ")}
    assert tried["silu"].endswith("1 node(s); %out (mul) at model.py:7: %y should be the same "
                                  "value as %x (both are 'x')")
    assert tried["quick_gelu"].endswith("%y is a graph input or weight, not mul")


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
    not_fired = report.split("did not match):\n")[1].split("op counts")[0]
    assert "  silu " not in not_fired and "  quick_gelu " in not_fired
