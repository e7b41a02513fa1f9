"""fusion_report: op counts before and after, and how often each pattern fired."""

from __future__ import annotations

from pathlib import Path

from compiler.ir import parse_ir
from passes import PassManager
from passes.fusion.report import fusion_report, op_counts, records_of
from passes.fusion.sets import explain_fusion

CASES = Path(__file__).with_name("fuse_cases")


def test_report_lists_patterns_op_counts_and_groups():
    graph = parse_ir((CASES / "gelu_tanh.dzir").read_text())
    before = op_counts(graph)
    manager = PassManager("fuse,fuse_groups")
    graph = manager.run(graph)
    assert fusion_report(before, graph, records_of(manager)) == "\n".join([
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
    report = fusion_report(parse_ir(text), graph, records_of(manager))
    assert report.splitlines()[1] == "patterns fired: none"
    assert report.splitlines()[-1] == "fusion groups: 1 kernels covering 6 nodes (largest 6)"


def test_explain_fusion_lists_every_candidate_rule():
    graph = parse_ir((CASES / "rms.dzir").read_text())
    verdicts = dict(explain_fusion(graph, "%n"))
    assert verdicts["rms_norm"] == "matches"
    assert verdicts["layer_norm"].startswith("%x is a graph input or weight, not ")
    assert "silu" in verdicts and verdicts["silu"] != "matches"
