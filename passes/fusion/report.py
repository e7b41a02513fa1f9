"""What fusion did, as text: op counts before and after, and how often each pattern fired."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

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


def fusion_report(before: Graph | Mapping[str, int], after: Graph,
                  records: Iterable[RewriteRecord] = (),
                  misses: Iterable[RewriteMiss] = ()) -> str:
    """Op counts before -> after (changed ops only), patterns fired, why each pattern that was
    tried but never fired did not match, and the fusion groups."""
    old = op_counts(before) if isinstance(before, Graph) else Counter(before)
    new = op_counts(after)
    lines = [f"fusion: {sum(old.values())} nodes -> {sum(new.values())} nodes"]
    fired = Counter(r.rule for r in records)
    if fired:
        lines.append("patterns fired:")
        lines += [f"  {rule:<28}{count:>6}" for rule, count in sorted(fired.items())]
    else:
        lines.append("patterns fired: none")
    lines += _not_fired(misses, fired)
    changed = sorted(op for op in set(old) | set(new) if old[op] != new[op])
    if changed:
        lines.append(f"op counts:   {'op':<28}{'before':>8}{'after':>8}")
        lines += [f"             {op:<28}{old[op]:>8}{new[op]:>8}" for op in changed]
    groups = Counter(n.attrs["fusion_group"] for n in after.nodes if "fusion_group" in n.attrs)
    if groups:
        lines.append(f"fusion groups: {len(groups)} kernels covering {sum(groups.values())} "
                     f"nodes (largest {max(groups.values())})")
    return "\n".join(lines)


def _not_fired(misses: Iterable[RewriteMiss], fired: Counter) -> list[str]:
    """One line per pattern tried at some node but fired nowhere: how many nodes it was tried
    at, and the first of them with the reason the match stopped there."""
    first: dict[str, RewriteMiss] = {}
    tried: Counter = Counter()
    for miss in misses:
        if miss.rule not in fired:
            first.setdefault(miss.rule, miss)
            tried[miss.rule] += 1
    if not first:
        return []
    lines = ["patterns tried that did not fire (first node tried, and why it did not match):"]
    for rule in sorted(first):
        m = first[rule]
        where = f" at {m.loc}" if m.loc else ""
        lines.append(f"  {rule:<28}{tried[rule]:>6} node(s); {m.anchor}{where}: {m.reason}")
    return lines
