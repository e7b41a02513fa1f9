"""What fusion did: op counts before and after, how often each pattern fired, and why each
pattern that was tried fired nowhere (by reason, nearest misses first, with source lines).

Most patterns tried on a model cannot apply to it at all (a mixture of experts' on a dense
model): their root op matched and nothing below it. `FusionReport.near_misses()` keeps the
reasons of the patterns that matched partly, the ones worth reading (`compile --report`);
the whole report (`--report=all`) has them all.
"""

from __future__ import annotations

import linecache
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

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
    partial: bool = False  # the match got past the pattern's root (see `matched_partly`)

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
    partial_reasons: int = 0  # groups whose match got past the root, shown or not

    def nearness(self) -> tuple:
        top = self.groups[0]
        return (not top.structure_matched, -top.depth, self.rule)

    def near(self) -> RuleMisses | None:
        """Only the reasons where the pattern matched partly; None when it never did.
        Partial groups rank first (they are deeper), so the kept groups hold all of them
        up to MAX_REASONS."""
        if not self.partial_reasons:
            return None
        kept = [g for g in self.groups if g.partial]
        return replace(self, groups=kept, more_reasons=self.partial_reasons - len(kept))


@dataclass(frozen=True)
class FusionReport:
    """What fusion did: printed as text by `compile --report`, drawn as a page by --html."""
    before: Counter
    after: Counter
    fired: Counter
    not_fired: list[RuleMisses]  # nearest misses first
    groups: Counter  # fusion group -> nodes in it
    left_out: int = 0  # patterns tried whose misses `near_misses` left out

    def near_misses(self) -> FusionReport:
        """This report with the misses of the patterns that matched partly only."""
        near = [entry.near() for entry in self.not_fired]
        kept = [entry for entry in near if entry is not None]
        return replace(self, not_fired=kept,
                       left_out=self.left_out + len(self.not_fired) - len(kept))

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
        if self.left_out:
            lines.append(f"patterns tried that did not fire and matched nothing past their "
                         f"first node: {self.left_out} (--report=all lists them)")
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
    fired, arity = set(fired), _root_arities()
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
        group.partial = group.partial or matched_partly(miss, arity.get(miss.rule))
        if len(group.examples) < MAX_EXAMPLES:
            group.examples.append(MissExample(miss.anchor, miss.loc, source_line(miss.loc)))
    out = []
    for rule, found in by_rule.items():
        ranked = sorted(found.values(),
                        key=lambda g: (not g.structure_matched, -g.depth, -g.count))
        out.append(RuleMisses(rule, tried[rule], ranked[:MAX_REASONS],
                              max(0, len(ranked) - MAX_REASONS),
                              sum(g.partial for g in ranked)))
    return sorted(out, key=RuleMisses.nearness)


def matched_partly(miss: RewriteMiss, root_arity: int | None) -> bool:
    """Whether a failed match got past the pattern's root node: the whole structure matched
    (a check refused it), or it failed deeper than the root's own operands reach. The matcher
    counts depth one per operand walked, so a failure deeper than the root's operand count is
    inside an operand whose op matched. A miss one level below an operand can sit within that
    count too: this errs towards the short report leaving a partial miss out, and never keeps
    one that matched the root alone. (A rule the sets do not know is taken as binary.)"""
    if miss.structure_matched:
        return True
    return miss.depth > (root_arity if root_arity is not None else 1)


def _root_arities() -> dict[str, int]:
    """Rule name -> operands of its pattern's root (the most over its alternatives)."""
    from ..rewrite.pattern import AnyOf, OpPattern
    from .sets import RULE_SETS

    def arity(pattern) -> int:
        if isinstance(pattern, AnyOf):
            return max((arity(p) for p in pattern.alternatives), default=0)
        return len(pattern.inputs) if isinstance(pattern, OpPattern) else 0

    return {rule.name: arity(rule.pattern) for rules in RULE_SETS.values() for rule in rules}


def source_line(loc: str | None) -> str:
    """The code at `file:line` (stripped), or "" when the file cannot be read. Relative paths
    are found as the frontend writes them: from the working directory or site-packages."""
    if not loc or ":" not in loc:
        return ""
    path, _, line = loc.rpartition(":")
    if not line.isdigit():
        return ""
    return linecache.getline(path, int(line)).strip()
