"""What fusion did, as text: op counts before and after, and how often each pattern fired."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from compiler.ir import Graph

from ..rewrite import RewriteRecord


def op_counts(graph: Graph) -> Counter:
    """Nodes per op (take it before running passes: they change the graph in place)."""
    return Counter(node.op for node in graph.nodes)


def records_of(manager) -> list[RewriteRecord]:
    """The rewrite records of every `fuse` pass in a PassManager's last run, in order."""
    from ..fuse import Fuse

    records: list[RewriteRecord] = []
    for pass_ in manager.passes:
        if isinstance(pass_, Fuse):
            records.extend(pass_.records())
    return records


def fusion_report(before: Graph | Mapping[str, int], after: Graph,
                  records: Iterable[RewriteRecord] = ()) -> str:
    """Op counts before -> after (changed ops only), patterns fired, and the fusion groups."""
    old = op_counts(before) if isinstance(before, Graph) else Counter(before)
    new = op_counts(after)
    lines = [f"fusion: {sum(old.values())} nodes -> {sum(new.values())} nodes"]
    fired = Counter(r.rule for r in records)
    if fired:
        lines.append("patterns fired:")
        lines += [f"  {rule:<28}{count:>6}" for rule, count in sorted(fired.items())]
    else:
        lines.append("patterns fired: none")
    changed = sorted(op for op in set(old) | set(new) if old[op] != new[op])
    if changed:
        lines.append(f"op counts:   {'op':<28}{'before':>8}{'after':>8}")
        lines += [f"             {op:<28}{old[op]:>8}{new[op]:>8}" for op in changed]
    groups = Counter(n.attrs["fusion_group"] for n in after.nodes if "fusion_group" in n.attrs)
    if groups:
        lines.append(f"fusion groups: {len(groups)} kernels covering {sum(groups.values())} "
                     f"nodes (largest {max(groups.values())})")
    return "\n".join(lines)
