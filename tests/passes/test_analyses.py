"""The named analyses of passes (memory_plan, causal_masks, sharding) and how the pass manager
keeps, drops and dumps them."""

from __future__ import annotations

from textwrap import dedent

import passes.plan_memory as plan_memory
from compiler.ir import parse_ir, print_ir
from passes import PassManager, parse_pipeline
from passes.memory import MemoryPlan
from passes.parallel.propagate_sharding import infer_layouts
from passes.plan_memory import memory_plan_for
from tests.passes.test_parallel_propagate import PROPAGATED, SEEDED
from tests.passes.test_recognize_causal_masks import ARANGE, attention

TEXT = dedent("""\
    graph main {
      symbol s0 in [1, 16]
      input %x: f32[s0, 4]
      %r: f32[s0, 4] = reshape(%x) {shape=[s0, 4]}
      %a: f32[s0, 4] = exp(%r)
      %b: f32[s0, 4] = mul(%a, %x)
      %c: f32[s0, 4] = add(%b, %a)
      return %c
    }
    """)
PLAN_HEADER = "# analysis memory_plan{algorithm=all,alignment=64,inplace=true,sizes=}:"


def _body(path) -> str:
    return "".join(line for line in path.read_text().splitlines(keepends=True)
                   if not line.startswith("#"))


def test_memory_plan_is_planned_once_for_the_pass_and_the_driver(monkeypatch):
    runs = []
    real = plan_memory.plan_graph
    monkeypatch.setattr(plan_memory, "plan_graph", lambda *a, **k: runs.append(1) or real(*a, **k))
    manager = PassManager("plan_memory")
    graph = manager.run(parse_ir(TEXT))
    recorded = memory_plan_for(manager.passes, graph)
    assert len(runs) == 1
    assert MemoryPlan.from_json(recorded) == graph.analysis("memory_plan", sizes="", alignment=64,
                                                            inplace=True, algorithm="all")
    graph.add_node("neg", [graph.outputs[0]])  # the final graph changed: planned again
    assert MemoryPlan.from_json(memory_plan_for(manager.passes, graph)).steps == 5
    assert len(runs) == 2


def test_dump_prints_the_memory_plan_after_the_graph_and_parses_back(tmp_path):
    manager = PassManager("remove_noops,plan_memory", dump_dir=tmp_path)
    graph = manager.run(parse_ir(TEXT))
    text = (tmp_path / "02-plan_memory.dzir").read_text()
    plan = graph.analysis("memory_plan", sizes="", alignment=64, inplace=True, algorithm="all")
    block = text[text.index(PLAN_HEADER):].splitlines()
    assert block[1] == (f"#   arena {plan.arena_bytes} B (lower bound {plan.lower_bound} B, "
                        f"naive {plan.naive_total} B); planner {plan.algorithm}; sized for "
                        "s0=16; alignment 64 B; 3 steps")
    assert [line for line in block if line.startswith("#   %a:")] == [
        f"#   %a: offset {b.offset}, {b.size} B, steps {b.first}..{b.last}"
        for b in plan.buffers if b.value == "a"]
    assert print_ir(parse_ir(text)) == print_ir(graph) == _body(tmp_path / "02-plan_memory.dzir")
    assert "# analysis" not in (tmp_path / "01-remove_noops.dzir").read_text()


def test_a_changing_pass_drops_the_plan_from_later_dumps(tmp_path):
    manager = PassManager("plan_memory,remove_noops,eliminate_dead_code", dump_dir=tmp_path)
    graph = manager.run(parse_ir(TEXT))
    assert PLAN_HEADER in (tmp_path / "01-plan_memory.dzir").read_text()
    assert "# analysis" not in (tmp_path / "02-remove_noops.dzir").read_text()  # changed
    assert graph.analysis_cache == {}


def test_sharding_is_preserved_by_propagation_and_dumped(tmp_path):
    manager = PassManager("propagate_sharding{tp=2}", dump_dir=tmp_path)
    graph = manager.run(parse_ir(SEEDED))
    assert print_ir(graph) == PROPAGATED
    inference = graph.analysis("sharding", dp=1, tp=2)
    assert inference.needs == []  # every conversion is in the graph now
    again = infer_layouts(graph, {"tp": 2})
    assert {v.name: str(again.of(v)) for v in graph.values()} == \
        {v.name: str(inference.of(v)) for v in graph.values()}
    text = (tmp_path / "01-propagate_sharding.dzir").read_text()
    block = text[text.index("# analysis sharding{dp=1,tp=2}:"):].splitlines()
    assert "#   %h: tp:S1" in block and "#   %y.shard: tp:P" in block
    assert not any(line.startswith(("#   %x:", "#   %z:", "#   %y.ar:")) for line in block)
    assert print_ir(parse_ir(text)) == PROPAGATED


PADDED = attention(ARANGE + """
    %am_bool: bool[1, s0] = cast(%am) {dtype=bool}
    %causal: bool[s0, s0] = le(%col, %row)
    %mask: bool[s0, s0] = bitwise_and(%causal, %am_bool)
""", extra="input %am: i64[1, s0]")


def test_mask_verdicts_are_an_analysis_and_dumped_when_the_pass_changes_nothing(tmp_path):
    graph = parse_ir(PADDED)
    (verdict,) = graph.analysis("causal_masks").verdicts.values()
    assert verdict.why == "the mask depends on a graph input or on an op this pass cannot read"
    PassManager("recognize_causal_masks", dump_dir=tmp_path).run(parse_ir(PADDED))
    text = (tmp_path / "01-recognize_causal_masks.dzir").read_text()
    assert "# analysis causal_masks:\n#   %o: not causal: the mask depends on a graph input" \
        in text


def test_rerunning_the_mask_pass_outside_the_manager_sees_its_own_edit():
    graph = parse_ir(attention(ARANGE + "%mask: bool[s0, s0] = le(%col, %row)"))
    (pass_,) = parse_pipeline("recognize_causal_masks")
    (verdict,) = graph.analysis("causal_masks").verdicts.values()
    assert verdict.why is None and verdict.window is None
    assert pass_.run(graph).changed is True
    assert pass_.run(graph).changed is False  # the cached proof was dropped with the edit
    assert graph.analysis("causal_masks").verdicts == {}


def test_mask_prover_reads_each_node_once_across_attention_nodes(monkeypatch):
    """Two attention nodes share one mask: the second proof reuses the first one's facts."""
    import passes.recognize_causal_masks as rcm

    text = attention(ARANGE + "%mask: bool[s0, s0] = le(%col, %row)").replace(
        "  return %o", "  %o2: f32[1, 2, s0, 8] = scaled_dot_product_attention(%o, %k, %v, "
        "%mask) {is_causal=false, scale=0.35, enable_gqa=false, window=none, "
        "softcap=none}\n  return %o2")
    graph = parse_ir(text)
    seen = []
    real = rcm.MaskProver._transfer
    monkeypatch.setattr(rcm.MaskProver, "_transfer",
                        lambda self, node, args: seen.append(node.op) or real(self, node, args))
    verdicts = graph.analysis("causal_masks").verdicts
    assert [v.why for v in verdicts.values()] == [None, None]
    assert sorted(seen) == ["arange", "le", "reshape", "reshape"]
