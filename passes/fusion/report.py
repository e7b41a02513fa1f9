"""What fusion did: op counts before and after, and how often each pattern fired."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from compiler.ir import Graph

from ..rewrite import RewriteMiss, RewriteRecord


def op_counts(graph: Graph) -> Counter:
    """Nodes per op (take it before running passes: they change the graph in place)."""
    return Counter(node.op for node in graph.nodes)


def records_of(manager) -> list[RewriteRecord]:
    """The rewrite records of every `fuse` pass in a PassManager's last run, in order.

    Passes are found by their registered name: the pattern sets sit below the pass that runs
    them and do not import it."""
    return [r for p in _fuse_passes(manager) for r in p.records()]


def misses_of(manager) -> list[RewriteMiss]:
    """The failed attempts of the last sweep of every `fuse` pass in a PassManager's last run."""
    return [m for p in _fuse_passes(manager) for m in p.misses()]


def _fuse_passes(manager) -> list:
    return [p for p in manager.passes if p.name == "fuse"]


@dataclass(frozen=True)
class FusionReport:
    """What fusion did: printed as text by `compile --report`, drawn as a page by --html."""
    before: Counter
    after: Counter
    fired: Counter
    not_fired: list[tuple[str, int, RewriteMiss]]  # rule, nodes tried, the first miss
    groups: Counter  # fusion group -> nodes in it

    def changed(self) -> list[str]:
        return sorted(op for op in set(self.before) | set(self.after)
                      if self.before[op] != self.after[op])

    def __str__(self) -> str:
        lines = [f"fusion: {sum(self.before.values())} nodes -> {sum(self.after.values())} nodes"]
        if self.fired:
            lines.append("patterns fired:")
            lines += [f"  {rule:<28}{count:>6}" for rule, count in sorted(self.fired.items())]
        else:
            lines.append("patterns fired: none")
        if self.not_fired:
            lines.append("patterns tried that did not fire (first node tried, and why it did "
                         "not match):")
            for rule, tried, m in self.not_fired:
                where = f" at {m.loc}" if m.loc else ""
                lines.append(f"  {rule:<28}{tried:>6} node(s); {m.anchor}{where}: {m.reason}")
        if self.changed():
            lines.append(f"op counts:   {'op':<28}{'before':>8}{'after':>8}")
            lines += [f"             {op:<28}{self.before[op]:>8}{self.after[op]:>8}"
                      for op in self.changed()]
        if self.groups:
            lines.append(f"fusion groups: {len(self.groups)} kernels covering "
                         f"{sum(self.groups.values())} nodes (largest {max(self.groups.values())})")
        return "\n".join(lines)


def fusion_report(before: Graph | Mapping[str, int], after: Graph,
                  records: Iterable[RewriteRecord] = (),
                  misses: Iterable[RewriteMiss] = ()) -> FusionReport:
    """Op counts before -> after, patterns fired, why each pattern that was tried but never
    fired did not match, and the fusion groups."""
    old = op_counts(before) if isinstance(before, Graph) else Counter(before)
    fired = Counter(r.rule for r in records)
    groups = Counter(n.attrs["fusion_group"] for n in after.nodes if "fusion_group" in n.attrs)
    return FusionReport(old, op_counts(after), fired, _not_fired(misses, fired), groups)


def _not_fired(misses: Iterable[RewriteMiss], fired: Counter) -> list[tuple[str, int, RewriteMiss]]:
    """Each pattern tried at some node but fired nowhere: how many nodes it was tried at, and
    the first of them (with the reason the match stopped there)."""
    first: dict[str, RewriteMiss] = {}
    tried: Counter = Counter()
    for miss in misses:
        if miss.rule not in fired:
            first.setdefault(miss.rule, miss)
            tried[miss.rule] += 1
    return [(rule, tried[rule], first[rule]) for rule in sorted(first)]
