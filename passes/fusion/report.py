"""What fusion did: op counts before and after, how often each pattern fired, and why each
pattern that was tried fired nowhere (by reason, nearest misses first, with source lines)."""

from __future__ import annotations

import linecache
import re
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


# Each pattern that did not fire lists at most this many reasons, and each reason at most this
# many of the nodes where it stopped the match: a reason shared by a thousand nodes is one line.
MAX_REASONS = 4
MAX_EXAMPLES = 3

# Value names in a reason (`%mul_12`, `@layers.0.weight`): misses whose reasons differ only there
# are one group.
_NAME = re.compile(r"[%@][\w.]+")


@dataclass(frozen=True)
class MissExample:
    """One node where a reason stopped a pattern: the node, its source line and that line's code."""
    anchor: str
    loc: str | None
    code: str


@dataclass
class MissGroup:
    """The nodes where one pattern stopped for the same reason (names aside), the first few kept.

    `reason` is the first node's own reason; `structure_matched`: the whole pattern matched there
    and a check rejected it (the nearest kind of miss)."""
    reason: str
    count: int
    depth: int
    structure_matched: bool
    examples: list[MissExample]

    def why(self) -> str:
        """The reason as the report words it: a rejected full match says so."""
        return f"the pattern matched, but {self.reason}" if self.structure_matched else self.reason


@dataclass(frozen=True)
class RuleMisses:
    """Why one pattern that was tried fired nowhere: its reason groups, nearest first."""
    rule: str
    tried: int
    groups: list[MissGroup]
    more_reasons: int  # groups left out beyond MAX_REASONS

    def nearness(self) -> tuple:
        top = self.groups[0]
        return (not top.structure_matched, -top.depth, self.rule)


@dataclass(frozen=True)
class FusionReport:
    """What fusion did: printed as text by `compile --report`, drawn as a page by --html."""
    before: Counter
    after: Counter
    fired: Counter
    not_fired: list[RuleMisses]  # nearest misses first
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
            lines.append("patterns tried that did not fire (why, by reason; nearest misses "
                         "first):")
            for entry in self.not_fired:
                lines += _miss_lines(entry)
        if self.changed():
            lines.append(f"op counts:   {'op':<28}{'before':>8}{'after':>8}")
            lines += [f"             {op:<28}{self.before[op]:>8}{self.after[op]:>8}"
                      for op in self.changed()]
        if self.groups:
            lines.append(f"fusion groups: {len(self.groups)} kernels covering "
                         f"{sum(self.groups.values())} nodes (largest {max(self.groups.values())})")
        return "\n".join(lines)


def _miss_lines(entry: RuleMisses) -> list[str]:
    lines = [f"  {entry.rule:<28}{entry.tried:>6} node(s)"]
    for group in entry.groups:
        lines.append(f"    {group.count} x {group.why()}")
        for ex in group.examples:
            where = f" at {ex.loc}" if ex.loc else ""
            code = f": {ex.code}" if ex.code else ""
            lines.append(f"        {ex.anchor}{where}{code}")
        if group.count > len(group.examples):
            lines.append(f"        ... and {group.count - len(group.examples)} more")
    if entry.more_reasons:
        lines.append(f"    ... and {entry.more_reasons} more reason(s)")
    return lines


def fusion_report(before: Graph | Mapping[str, int], after: Graph,
                  records: Iterable[RewriteRecord] = (),
                  misses: Iterable[RewriteMiss] = ()) -> FusionReport:
    """Op counts before -> after, patterns fired, why each pattern that was tried but never
    fired did not match (grouped by reason, with the first nodes and their source lines), and
    the fusion groups."""
    old = op_counts(before) if isinstance(before, Graph) else Counter(before)
    fired = Counter(r.rule for r in records)
    groups = Counter(n.attrs["fusion_group"] for n in after.nodes if "fusion_group" in n.attrs)
    return FusionReport(old, op_counts(after), fired, not_fired(misses, fired), groups)


def not_fired(misses: Iterable[RewriteMiss], fired: Counter | Iterable[str] = ()) \
        -> list[RuleMisses]:
    """Each pattern tried at some node but fired nowhere: the nodes it was tried at, grouped by
    reason (value names aside), nearest misses first. One pass over the misses; only the first
    few nodes of each group are kept."""
    fired = set(fired)
    by_rule: dict[str, dict[str, MissGroup]] = {}
    tried: Counter = Counter()
    for miss in misses:
        if miss.rule in fired:
            continue
        tried[miss.rule] += 1
        key = f"{miss.structure_matched}:{_NAME.sub('%', miss.reason)}"
        group = by_rule.setdefault(miss.rule, {}).get(key)
        if group is None:
            group = by_rule[miss.rule][key] = MissGroup(miss.reason, 0, miss.depth,
                                                        miss.structure_matched, [])
        group.count += 1
        group.depth = max(group.depth, miss.depth)
        if len(group.examples) < MAX_EXAMPLES:
            group.examples.append(MissExample(miss.anchor, miss.loc, source_line(miss.loc)))
    out = []
    for rule, found in by_rule.items():
        ranked = sorted(found.values(),
                        key=lambda g: (not g.structure_matched, -g.depth, -g.count))
        out.append(RuleMisses(rule, tried[rule], ranked[:MAX_REASONS],
                              max(0, len(ranked) - MAX_REASONS)))
    return sorted(out, key=RuleMisses.nearness)


def source_line(loc: str | None) -> str:
    """The code at `file:line` (stripped), or "" when the file cannot be read. Relative paths
    are found as the frontend writes them: from the working directory or site-packages."""
    if not loc or ":" not in loc:
        return ""
    path, _, line = loc.rpartition(":")
    if not line.isdigit():
        return ""
    return linecache.getline(path, int(line)).strip()
