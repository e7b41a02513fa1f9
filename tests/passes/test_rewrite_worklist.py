"""The worklist driver: the same rewrites as full sweeps until nothing changes, with work (rule
match attempts) linear in the graph; a count, not a timing, so it cannot flake."""

from __future__ import annotations

from pathlib import Path

import pytest

from compiler.ir import Graph, parse_ir, print_ir, verify
from passes.fusion.sets import PHASES, RULE_SETS
from passes.rewrite import RuleSet, apply_match, apply_rules
from passes.rewrite.driver import DriverStats

CASES = Path(__file__).with_name("fuse_cases")
NAMES = sorted(p.name[:-len(".dzir")] for p in CASES.glob("*.dzir")
               if not p.name.endswith(".expected.dzir"))


def phases() -> list[RuleSet]:
    return [sum((RULE_SETS[n] for n in phase if n in RULE_SETS), RuleSet()) for phase in PHASES]


def full_sweeps(graph: Graph, rules: RuleSet, max_sweeps: int = 16) -> list:
    """The driver as it was before the worklist: sweep every node until a sweep changes
    nothing, readers from a whole-graph table rebuilt after every rewrite."""
    records = []
    for _ in range(max_sweeps):
        changed, i, budget = False, 0, 8 * max(len(graph.nodes), 1)
        while i < len(graph.nodes) and budget > 0:
            node, chosen, found = graph.nodes[i], None, None
            for candidate in rules.for_op(node.op):
                found = candidate.match(graph, node, graph.users())
                if found:
                    chosen = candidate
                    break
            if chosen is None:
                i += 1
                continue
            record, created = apply_match(graph, chosen, found)
            records.append(record)
            changed, budget = True, budget - 1
            i = graph.nodes.index(created[0]) if created else max(0, i - len(found.nodes))
        if not changed:
            break
    return records


def blocks(n: int) -> str:
    """`n` decoder-like blocks in decomposed form: RMSNorm with its weight, a SiLU-gated MLP and
    a residual add (the next block's norm of that sum is an add + norm)."""
    lines = ["graph main {", "  symbol s0 in [1, 64]", "  input %h0: f32[1, s0, 8]"]
    for i in range(n):
        lines += [f"  weight @w{i}: f32[8]", f"  weight @gate{i}: f32[16, 8]",
                  f"  weight @up{i}: f32[16, 8]", f"  weight @down{i}: f32[8, 16]"]
    for i in range(n):
        t = "f32[1, s0, 8]"
        lines += [
            f"  %two{i}: f32[] = constant() {{value=2.0, dtype=f32}}",
            f"  %sq{i}: {t} = pow(%h{i}, %two{i})",
            f"  %var{i}: f32[1, s0, 1] = mean(%sq{i}) {{dims=[-1], keepdim=true}}",
            f"  %eps{i}: f32[] = constant() {{value=1e-06, dtype=f32}}",
            f"  %ve{i}: f32[1, s0, 1] = add(%var{i}, %eps{i})",
            f"  %r{i}: f32[1, s0, 1] = rsqrt(%ve{i})",
            f"  %n{i}: {t} = mul(%h{i}, %r{i})",
            f"  %nw{i}: {t} = mul(@w{i}, %n{i})",
            f"  %g{i}: f32[1, s0, 16] = linear(%nw{i}, @gate{i}, _)",
            f"  %sg{i}: f32[1, s0, 16] = sigmoid(%g{i})",
            f"  %a{i}: f32[1, s0, 16] = mul(%g{i}, %sg{i})",
            f"  %u{i}: f32[1, s0, 16] = linear(%nw{i}, @up{i}, _)",
            f"  %m{i}: f32[1, s0, 16] = mul(%u{i}, %a{i})",
            f"  %d{i}: {t} = linear(%m{i}, @down{i}, _)",
            f"  %h{i + 1}: {t} = add(%h{i}, %d{i})",
        ]
    lines += [f"  return %h{n}", "}"]
    return "\n".join(lines) + "\n"


def fuse_rules(graph: Graph, stats: DriverStats | None = None) -> list:
    return [r for rules in phases() for r in apply_rules(graph, rules, stats=stats)]


@pytest.mark.parametrize("name", NAMES)
def test_worklist_rewrites_what_full_sweeps_rewrite(name):
    text = (CASES / f"{name}.dzir").read_text()
    worklist, sweeps = parse_ir(text), parse_ir(text)
    got = fuse_rules(worklist)
    want = [r for rules in phases() for r in full_sweeps(sweeps, rules)]
    assert got == want
    assert print_ir(worklist) == print_ir(sweeps)
    verify(worklist)


def test_worklist_matches_full_sweeps_on_repeated_blocks():
    worklist, sweeps = parse_ir(blocks(6)), parse_ir(blocks(6))
    got = fuse_rules(worklist)
    want = [r for rules in phases() for r in full_sweeps(sweeps, rules)]
    assert [r.rule for r in got] == [r.rule for r in want]
    assert print_ir(worklist) == print_ir(sweeps)
    ops = [n.op for n in worklist.nodes]
    assert ops.count("add_rms_norm") == 5 and ops.count("rms_norm") == 1  # every block fused
    assert "sigmoid" not in ops and "rsqrt" not in ops


def rooted(graph: Graph) -> int:
    """Match attempts one try of every rule at every node takes."""
    return sum(len(rules.for_op(n.op)) for rules in phases() for n in graph.nodes)


def test_match_attempts_grow_linearly_with_the_graph(monkeypatch):
    def no_scans(graph):
        raise AssertionError("the driver built a whole-graph users() table")

    monkeypatch.setattr(Graph, "users", no_scans)
    counts = {}
    for n in (4, 8, 16):
        stats, graph = DriverStats(), parse_ir(blocks(n))
        once = rooted(graph)
        fuse_rules(graph, stats)
        counts[n] = stats
        assert stats.rewrites > 4 * n
        assert stats.attempts <= 2 * once  # about one try per node, plus the confirming sweep
    assert counts[8].attempts <= 2.2 * counts[4].attempts
    assert counts[16].attempts <= 2.2 * counts[8].attempts
    # a constant number of sweeps per phase, not one per layer
    assert counts[16].sweeps == counts[4].sweeps


def test_a_second_run_tries_each_node_once_and_changes_nothing():
    graph = parse_ir(blocks(4))
    fuse_rules(graph)
    stats = DriverStats()
    assert fuse_rules(graph, stats) == []
    assert stats.rewrites == 0 and stats.sweeps == len(phases())
    assert stats.attempts == rooted(graph)
