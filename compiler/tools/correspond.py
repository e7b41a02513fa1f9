"""Which value of the reference graph each value of the compiled graph stands for.

The compiled graph is the exported graph after passes: most nodes keep their names, but passes
insert casts, fold, deduplicate and fuse. A compiled value is matched, in this order, when:

1. name: a reference value has its name and is made by the same op (passes never reuse a
   name for another computation of the same op; a fused node may take over the name of the
   value it replaced, but its op differs);
2. origin: it is a fused node's result (`origin` lists the export-level nodes it replaced) and
   exactly one value computed inside that region is read outside it (or is a graph output);
3. reader: a matched node (same name, same op) reads it at position i, where its reference
   counterpart reads a reference value: both are that node's i-th operand (casts the precision
   pass inserted, slices of a horizontally merged linear, a fused node read by a plain node);
4. output: it is the i-th graph output.

Rules 3 and 4 repeat until nothing new matches. A compiled value without a counterpart (a merged
qkv projection has none) is not compared. The same graph on both sides matches every value by
name.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.ir import Graph, Node, Value


@dataclass(frozen=True)
class Match:
    ref: Value
    rule: str  # "name", "origin", "reader", "output" or "input"


def correspond(compiled: Graph, reference: Graph) -> dict[int, Match]:
    """Compiled value id -> its reference counterpart (see the module docstring)."""
    matches: dict[int, Match] = {}
    if compiled is reference:
        return {id(v): Match(v, "name") for n in compiled.nodes for v in n.outputs}
    for c, r in zip(compiled.inputs, reference.inputs):
        matches[id(c)] = Match(r, "input")
    _by_name(compiled, reference, matches)
    _by_origin(compiled, reference, matches)
    _by_readers(compiled, reference, matches)
    return matches


def _label(node: Node) -> str:
    return f"%{node.outputs[0].name} {node.op}"


def _by_name(compiled: Graph, reference: Graph, matches: dict[int, Match]) -> None:
    ref_values = {v.name: v for n in reference.nodes for v in n.outputs}
    for node in compiled.nodes:
        for value in node.outputs:
            ref = ref_values.get(value.name)
            if ref is not None and ref.producer.op == node.op:
                matches[id(value)] = Match(ref, "name")


def _by_origin(compiled: Graph, reference: Graph, matches: dict[int, Match]) -> None:
    nodes = {_label(n): n for n in reference.nodes if n.outputs}
    users = reference.users()
    returned = {id(v) for v in reference.outputs}
    for node in compiled.nodes:
        origin = node.attrs.get("origin")
        if not origin or len(node.outputs) != 1:
            continue
        region = [nodes[label] for label in origin if label in nodes]
        if len(region) != len(origin):
            continue  # the origin names nodes this reference does not have
        inside = {id(n) for n in region}
        escaping = [v for n in region for v in n.outputs
                    if id(v) in returned or any(id(u) not in inside for u in users.get(v, []))]
        if len(escaping) == 1:
            matches[id(node.outputs[0])] = Match(escaping[0], "origin")


def _by_readers(compiled: Graph, reference: Graph, matches: dict[int, Match]) -> None:
    changed = True
    while changed:
        changed = False
        for node in compiled.nodes:
            counterpart = _counterpart(node, matches)
            if counterpart is None or len(counterpart.inputs) != len(node.inputs):
                continue
            for value, ref in zip(node.inputs, counterpart.inputs):
                if _claim(value, ref, "reader", matches):
                    changed = True
        for value, ref in zip(compiled.outputs, reference.outputs):
            if _claim(value, ref, "output", matches):
                changed = True


def _counterpart(node: Node, matches: dict[int, Match]) -> Node | None:
    """The reference node a compiled node is, when it kept its name and op."""
    if not node.outputs:
        return None
    match = matches.get(id(node.outputs[0]))
    if match is None or match.rule != "name":
        return None
    return match.ref.producer


def _claim(value: Value | None, ref: Value | None, rule: str,
           matches: dict[int, Match]) -> bool:
    if value is None or ref is None or id(value) in matches or value.producer is None:
        return False
    matches[id(value)] = Match(ref, rule)
    return True
