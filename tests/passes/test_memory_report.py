"""What users see: `dayzero inspect --memory` and `--plot`, and the report behind them."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from compiler.cli import main
from compiler.writer import write_artifact
from passes.memory import MemoryPlan, plan_graph, verify_plan
from passes.memory.report import human_bytes, summarize
from tests.passes.memory_util import graph

MODEL = """
    graph main {
      symbol s0 in [1, 64]
      input %x: f32[s0, 16]
      weight @up: f32[128, 16]
      weight @down: f32[16, 128]
      %a: f32[s0, 128] = linear(%x, @up, _)
      %b: f32[s0, 128] = gelu(%a) {approximate="tanh"}
      %c: f32[s0, 16] = linear(%b, @down, _)
      %d: f32[s0, 16] = relu(%c)
      %y: f32[s0, 16] = add(%d, %x)
      return %y
    }
"""


def artifact(tmp_path, record: bool):
    g = graph(MODEL)
    g.weight_data.update({name: torch.randn(*v.type.shape) for name, v in g.weights.items()})
    extra = {"memory_plan": plan_graph(g, sizes={"s0": 32}).to_json()} if record else {}
    return write_artifact(tmp_path / "m.dz", g, "reference", manifest_extra=extra)


def test_human_bytes():
    assert [human_bytes(n) for n in (0, 1023, 1024, 1536, 5 * 2**20)] == [
        "0 B", "1023 B", "1.00 KiB", "1.50 KiB", "5.00 MiB"]


def test_summary_gives_totals_ratios_and_the_values_live_at_the_peak():
    g = graph(MODEL)
    plan = plan_graph(g)
    verify_plan(plan, g)
    text = summarize(plan, g, recorded=True)
    # %a (32 KiB) is live with %c (4 KiB) at step 2; %b overwrote %a, %d overwrites %c
    assert "plan peak (arena)    36.00 KiB  (36864 B)" in text
    assert "lower bound          36.00 KiB  (36864 B)   peak / lower bound = 1.000" in text
    assert "naive total          36.00 KiB  (36864 B)   peak / naive total = 1.000" in text
    assert "peak at step 2 of 5: %c = linear" in text
    lines = text.splitlines()
    table = lines[lines.index("largest values live at step 2:") + 1:]
    assert table[0].split() == ["value", "type", "bytes", "offset", "steps", "shared", "with"]
    assert table[1].split()[:2] == ["%a", "f32[s0,"] and "32.00 KiB" in table[1]
    assert table[1].endswith("%b") and table[2].split()[0] == "%c" and table[2].endswith("%d")


def test_inspect_memory_on_an_artifact_prints_the_recorded_plan(tmp_path, capsys):
    path = artifact(tmp_path, record=True)
    assert main(["inspect", str(path), "--memory"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("memory plan (recorded in the artifact)\n  sized for s0=32;")
    assert "peak / lower bound = 1.000" in out and "largest values live at step 2:" in out


def test_inspect_memory_computes_a_plan_when_none_is_recorded(tmp_path, capsys):
    path = artifact(tmp_path, record=False)
    assert main(["inspect", str(path), "--memory"]) == 0
    out = capsys.readouterr().out
    assert "not recorded; computed now" in out and "sized for s0=64" in out
    dzir = tmp_path / "m.dzir"
    dzir.write_text(textwrap.dedent(MODEL))
    assert main(["inspect", str(dzir), "--memory", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["recorded"] is False
    plan = MemoryPlan.from_json(data["memory_plan"])
    verify_plan(plan, graph(MODEL))


def test_inspect_plot_writes_a_png(tmp_path, capsys):
    path = artifact(tmp_path, record=True)
    png = tmp_path / "plots" / "arena.png"
    assert main(["inspect", str(path), "--plot", str(png)]) == 0
    assert capsys.readouterr().out == f"wrote {png}\n"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_inspect_memory_refuses_a_stale_recorded_plan(tmp_path, capsys):
    g = graph(MODEL)
    plan = plan_graph(g).to_json()
    plan["buffers"][0]["last"] += 1
    g.weight_data.update({name: torch.randn(*v.type.shape) for name, v in g.weights.items()})
    path = write_artifact(tmp_path / "m.dz", g, "reference", manifest_extra={"memory_plan": plan})
    assert main(["inspect", str(path), "--memory"]) == 1
    assert "the plan places %a" in capsys.readouterr().err


def test_unbounded_symbols_skip_planning_unless_bounds_required():
    from compiler.errors import DayzeroError
    from compiler.ir import parse_ir
    from passes import parse_pipeline
    from passes.plan_memory import memory_plan_for

    graph = parse_ir("graph main {\n  symbol s0 in [1, inf]\n  input %x: f32[s0, 4]\n"
                     "  %a: f32[s0, 4] = exp(%x)\n  %b: f32[s0, 4] = neg(%a)\n  return %b\n}\n")
    assert memory_plan_for(parse_pipeline("plan_memory"), graph) is None
    plan = memory_plan_for(parse_pipeline("plan_memory{sizes=s0:8}"), graph)
    assert plan is not None
    with pytest.raises(DayzeroError, match="no upper bound"):
        parse_pipeline("plan_memory{require_bounds=true}")[0].run(graph)
