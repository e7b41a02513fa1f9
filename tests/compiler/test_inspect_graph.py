"""`dayzero inspect --graph`: the IR as GraphML / DOT / SVG, with fusion groups, pipeline stages
and memory slots as attributes (compiler/commands/inspect_graph.py)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from textwrap import dedent

import networkx as nx
import pytest

from compiler.cli import main
from compiler.commands.inspect_graph import ir_digraph, to_dot, write_graph
from compiler.errors import DayzeroError
from compiler.ir import parse_ir

TEXT = dedent("""\
    graph main {
      symbol s0 in [1, 512]
      input %x: f32[s0, 64]
      weight @w: f32[64]
      %a: f32[s0, 64] = mul(%x, @w) {fusion_group=0}
      %b: f32[s0, 64] = exp(%a) {fusion_group=0}
      %c: f32[s0, 64] = relu(%b)
      return %c
    }
    """)

# stages and memory plan as a manifest records them (only the fields --graph reads)
MANIFEST = {
    "parallel": {"stages": [{"stage": 0, "nodes": [0, 2]}, {"stage": 1, "nodes": [2, 3]}]},
    "memory_plan": {"buffers": [{"value": "a", "offset": 0, "size": 256},
                                {"value": "c", "offset": 256, "size": 256}],
                    "aliases": [{"value": "b", "root": "a", "offset": 0, "kind": "inplace"}],
                    "external": []},
}


def test_digraph_has_a_vertex_per_input_weight_node_output_and_an_edge_per_use():
    g = ir_digraph(parse_ir(TEXT), MANIFEST)
    assert sorted(g.nodes) == ["input:x", "node:0", "node:1", "node:2", "output:0", "weight:w"]
    assert sorted(g.edges) == [("input:x", "node:0"), ("node:0", "node:1"), ("node:1", "node:2"),
                               ("node:2", "output:0"), ("weight:w", "node:0")]
    a, b, c = (g.nodes[f"node:{i}"] for i in range(3))
    assert (a["op"], a["types"], a["fusion_group"], a["stage"]) == ("mul", "f32[s0, 64]", 0, 0)
    assert (a["memory_offset"], a["memory_bytes"]) == (0, 256)
    assert (b["memory_offset"], b["memory_shares"]) == (0, "inplace of %a")
    assert "fusion_group" not in c and c["stage"] == 1 and c["memory_offset"] == 256
    assert a["ir"] == "%a: f32[s0, 64] = mul(%x, @w) {fusion_group=0}"
    assert g.edges["node:0", "node:1"] == {"value": "a", "type": "f32[s0, 64]"}


def test_graphml_round_trips_through_networkx(tmp_path):
    path = write_graph(tmp_path / "g.graphml", parse_ir(TEXT), MANIFEST)
    back = nx.read_graphml(path)
    assert back.number_of_nodes() == 6 and back.number_of_edges() == 5
    node = back.nodes["node:1"]
    assert (node["op"], node["fusion_group"], node["stage"], node["memory_offset"]) == \
        ("exp", 0, 0, 0)
    assert back.nodes["weight:w"]["kind"] == "weight"


def test_dot_has_a_line_per_vertex_and_edge_and_a_cluster_per_stage(tmp_path):
    text = write_graph(tmp_path / "g.dot", parse_ir(TEXT), MANIFEST).read_text()
    assert text.startswith('digraph "main" {') and text.endswith("}\n")
    assert '"node:0" [label="mul\\nf32[s0, 64]\\ngroup 0\\n@0", style="filled", ' \
           'fillcolor="#cfe2f3"];' in text
    assert '"input:x" [label="input x\\nf32[s0, 64]", shape="ellipse"];' in text
    assert '"node:0" -> "node:1" [label="%a"];' in text
    assert text.count(" -> ") == 5
    assert 'subgraph cluster_stage0 {' in text and 'label="stage 1";' in text


def test_dot_quotes_names_with_quotes_and_backslashes():
    g = ir_digraph(parse_ir(TEXT.replace("graph main", 'graph "a\\"b"')))
    assert to_dot(g).startswith('digraph "a\\"b" {')


def test_svg_is_rendered_by_graphviz_dot(tmp_path):
    """A stand-in `dot` that copies its input: the DOT text reaches Graphviz as a file and the
    output path is the one asked for."""
    fake = tmp_path / "dot"
    fake.write_text('#!/bin/sh\n[ "$1" = -Tsvg ] && [ "$2" = -o ] && cp "$4" "$3"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    out = write_graph(tmp_path / "g.svg", parse_ir(TEXT), dot=str(fake))
    assert out.read_text() == to_dot(ir_digraph(parse_ir(TEXT)))


def test_svg_without_graphviz_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no `dot` on it
    with pytest.raises(DayzeroError, match="needs Graphviz's `dot`") as info:
        write_graph(tmp_path / "g.svg", parse_ir(TEXT))
    assert "g.dot" in info.value.fix and not (tmp_path / "g.svg").exists()


def test_unknown_suffix_is_refused(tmp_path):
    with pytest.raises(DayzeroError, match="unknown format '.png'"):
        write_graph(tmp_path / "g.png", parse_ir(TEXT))


def test_cli_writes_the_artifacts_graph_with_its_memory_plan(tmp_path, capsys):
    out = tmp_path / "mlp.dz"
    mlp = f"{Path(__file__).resolve().parents[2]}/examples/mlp.py:build"
    assert main(["compile", mlp, "-o", str(out), "--backend", "reference", "--passes",
                 "remove_noops,fuse_groups,plan_memory"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(out), "--graph", str(tmp_path / "mlp.graphml")]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {tmp_path / 'mlp.graphml'} (")
    g = nx.read_graphml(tmp_path / "mlp.graphml")
    ops = [d for _, d in g.nodes(data=True) if d["kind"] == "op"]
    assert [d["op"] for d in ops] == ["linear", "gelu", "layer_norm", "linear", "gelu", "linear"]
    plan = json.loads((out / "manifest.json").read_text())["memory_plan"]
    slots = {b["value"]: (b["offset"], b["size"]) for b in plan["buffers"]}
    assert slots and {d["outputs"]: (d["memory_offset"], d["memory_bytes"]) for d in ops
                      if d["outputs"] in slots} == slots
    assert all("memory_offset" in d or "memory_shares" in d for d in ops)


def test_cli_writes_a_dzir_files_graph(tmp_path):
    source = tmp_path / "g.dzir"
    source.write_text(TEXT)
    assert main(["inspect", str(source), "--graph", str(tmp_path / "g.dot")]) == 0
    assert (tmp_path / "g.dot").read_text() == to_dot(ir_digraph(parse_ir(TEXT)))
    assert os.path.getsize(tmp_path / "g.dot") > 0
