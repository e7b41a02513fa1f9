"""Matching a pattern against the graph: read-only, with backtracking and reasons for failure.

`match_pattern(graph, pattern, node)` tries the pattern rooted at `node` and returns a
`MatchResult`: on success the bindings (variables, constants, captured attributes, named values)
and every node the pattern covered; on failure the reason from the deepest point the match
reached, so `explain` can say *why* a fusion did not fire ("%mean_3 (mean): attribute keepdim is
false, the pattern needs true"). Nothing here changes the graph.

Matching looks through the no-op nodes torch.export leaves (a view or cast to the same type,
`x * 1`, `x + 0`): a pattern operand matches the value itself or, failing that, what such a no-op
forwards. Variables bind the value with its no-ops stripped, so `x` reached directly and `x`
reached through an identity view are one binding.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from compiler.ir import Graph, Node, Value, get_op
from compiler.ir.symbolic import equal

from .pattern import AnyOf, Capture, Const, OpPattern, Pattern, Var


@dataclass
class MatchResult:
    """Outcome of one match attempt; truthy on success. `MatchResult.fail("why")` rejects.

    A failure says how near it came: `depth`, how far into the pattern the structural match got
    before it stopped (operands walked, a rough measure), and `structure_matched`, true when the
    whole pattern matched and a check or a reader outside the match rejected it (the nearest
    miss). The fusion report lists the nearest misses first."""

    ok: bool
    reason: str | None = None
    bindings: dict[str, Any] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    anchor: Node | None = None
    depth: int = 0
    structure_matched: bool = False

    def __bool__(self) -> bool:
        return self.ok

    @classmethod
    def fail(cls, reason: str, depth: int = 0, structure_matched: bool = False) -> MatchResult:
        return cls(False, reason, depth=depth, structure_matched=structure_matched)


def describe(value: Value | None, graph: Graph | None = None) -> str:
    """How messages name a value: `%x`, `@weight`, or `%h (add)` with its producing op."""
    if value is None:
        return "_"
    if value.producer is None:
        weight = graph is not None and graph.is_weight(value)
        return f"@{value.name}" if weight else f"%{value.name}"
    return f"%{value.name} ({value.producer.op})"


# -- types ---------------------------------------------------------------------------------------
def same_dim(a, b) -> bool:
    """Provably equal dims, cheaply: sympy keeps expressions canonical, so structural equality
    decides nearly every case; a constant never equals an expression over symbols; only two
    different expressions need sympy's (slow) simplification."""
    if a == b:
        return True
    a_static, b_static = isinstance(a, int), isinstance(b, int)
    if a_static or b_static:
        return False
    return equal(a, b)


def same_type(a, b) -> bool:
    return a.dtype == b.dtype and a.rank == b.rank and all(
        same_dim(x, y) for x, y in zip(a.shape, b.shape))


# -- constants and no-ops ------------------------------------------------------------------------
_SCALAR_SOURCES = ("constant", "full")
_SCALAR_FORWARDERS = ("cast", "expand", "reshape")


def constant_value(graph: Graph | None, value: Value | None) -> float | int | bool | None:
    """The scalar a value holds everywhere, when it is a known constant; else None.

    Constants are `constant`/`full` nodes (behind casts, expands and reshapes) and weights with
    known data of one element.
    """
    seen = 0
    while value is not None and seen < 8:
        node = value.producer
        if node is None:
            return _weight_scalar(graph, value)
        if node.op in _SCALAR_SOURCES:
            found = node.attrs["value"]
            # a size expression (`constant {value=s0}`: a cache length) is no known number
            return None if getattr(found, "free_symbols", None) else found
        if node.op not in _SCALAR_FORWARDERS:
            return None
        if node.op == "cast":
            inner = constant_value(graph, node.inputs[0])
            return None if inner is None else _cast_scalar(inner, value)
        value, seen = node.inputs[0], seen + 1
    return None


def _cast_scalar(scalar, value: Value):
    if value.dtype.is_float:
        return float(scalar)
    if value.dtype.value == "bool":
        return bool(scalar)
    return int(scalar)


def _weight_scalar(graph: Graph | None, value: Value):
    if graph is None or not graph.is_weight(value) or value.name not in graph.weight_data:
        return None
    data = graph.weight_data[value.name]
    count = data.numel() if hasattr(data, "numel") else getattr(data, "size", 0)
    if count != 1:
        return None
    return data.reshape(()).item()


_IDENTITY_CONSTANT = {"mul": 1, "div": 1, "add": 0, "sub": 0}


def transparent_input(graph: Graph | None, node: Node) -> Value | None:
    """What a no-op node forwards unchanged (same type, same values); None if it is not one."""
    kind = get_op(node.op).kind
    if len(node.outputs) != 1 or not node.inputs or node.inputs[0] is None:
        return None
    out = node.output
    if kind == "view" or node.op == "cast":
        x = node.inputs[0]
        if not same_type(x.type, out.type):
            return None
        if node.op == "permute" and list(node.attrs["dims"]) != list(range(x.type.rank)):
            return None
        return x
    identity = _IDENTITY_CONSTANT.get(node.op)
    if identity is None or len(node.inputs) != 2:
        return None
    operands = [0, 1] if node.op in ("mul", "add") else [0]
    for i in operands:
        x, c = node.inputs[i], node.inputs[1 - i]
        if same_type(x.type, out.type) and constant_value(graph, c) == identity:
            return x
    return None


def strip(graph: Graph | None, value: Value | None) -> Value | None:
    """A value with the no-op nodes in front of it skipped."""
    for _ in range(64):
        if value is None or value.producer is None:
            return value
        inner = transparent_input(graph, value.producer)
        if inner is None:
            return value
        value = inner
    return value


# -- the matcher ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Env:
    bindings: dict[str, Any]
    seen: dict[int, Value]          # id(pattern) -> the value it matched
    nodes: tuple[Node, ...]

    def bind(self, name: str | None, value: Any) -> _Env:
        if name is None:
            return self
        return _Env({**self.bindings, name: value}, self.seen, self.nodes)


class _Matcher:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.failure: tuple[int, str] = (-1, "no match")

    def name(self, value: Value | None) -> str:
        return describe(value, self.graph)

    def fail(self, depth: int, message: str) -> None:
        """Keep the reason from the deepest point reached (the first one, at equal depths)."""
        if depth > self.failure[0]:
            self.failure = (depth, message)

    def match(self, p: Pattern | None, v: Value | None, env: _Env, depth: int) -> Iterator[_Env]:
        if p is None:
            if v is None:
                yield env
            else:
                self.fail(depth, f"expected an absent operand, got {self.name(v)}")
            return
        if id(p) in env.seen:
            if strip(self.graph, env.seen[id(p)]) is strip(self.graph, v):
                yield env
            else:
                self.fail(depth, f"{self.name(v)} should be the same value as "
                                 f"{self.name(env.seen[id(p)])}")
            return
        if isinstance(p, Var):
            yield from self._var(p, v, env, depth)
        elif isinstance(p, Const):
            yield from self._const(p, v, env, depth)
        elif isinstance(p, AnyOf):
            for alt in p.alternatives:
                for found in self.match(alt, v, env, depth):
                    yield _Env(found.bindings, {**found.seen, id(p): v}, found.nodes).bind(
                        p.name, strip(self.graph, v))
        else:
            yield from self._op(p, v, env, depth)

    def _var(self, p: Var, v: Value | None, env: _Env, depth: int) -> Iterator[_Env]:
        v = strip(self.graph, v)
        if p.name in env.bindings and env.bindings[p.name] is not v:
            self.fail(depth, f"{self.name(v)} should be the same value as "
                             f"{self.name(env.bindings[p.name])} (both are '{p.name}')")
            return
        yield env.bind(p.name, v)

    def _const(self, p: Const, v: Value | None, env: _Env, depth: int) -> Iterator[_Env]:
        # 0-d only: a constant tensor could broadcast the other operand to a larger shape
        found = constant_value(self.graph, v) if v is not None and v.type.rank == 0 else None
        if found is None:
            self.fail(depth, f"{self.name(v)} is not a scalar constant")
            return
        if p.value is not None and not _close(found, p.value, p.rel_tol):
            self.fail(depth, f"{self.name(v)} is the constant {found!r}, the pattern needs "
                             f"{p.value!r}")
            return
        yield env.bind(p.name, found)

    def _op(self, p: OpPattern, v: Value | None, env: _Env, depth: int) -> Iterator[_Env]:
        """`v` itself, or what the no-ops in front of it forward, produced by `p.op`."""
        if v is None:
            self.fail(depth, f"expected {p.op}, got an absent operand")
            return
        through: list[Node] = []
        current = v
        while True:
            node = current.producer
            if node is None:
                self.fail(depth, f"{self.name(current)} is a graph input or weight, not {p.op}")
                return
            if node.op == p.op and len(node.outputs) > p.output \
                    and node.outputs[p.output] is current:
                yield from self._node(p, node, env, depth, through)
            else:
                self.fail(depth, f"{self.name(current)} is not {p.op}")
            inner = transparent_input(self.graph, node)
            if inner is None:
                return
            through = through + [node]
            current = inner

    def _node(self, p: OpPattern, node: Node, env: _Env, depth: int,
              through: list[Node]) -> Iterator[_Env]:
        where = self.name(node.outputs[p.output])
        for key, want in p.attrs.items():
            got = node.attrs.get(key)
            if isinstance(want, Capture):
                env = env.bind(want.name, got)
            elif callable(want):
                if not want(got):
                    self.fail(depth, f"{where}: attribute {key}={got!r} fails "
                                     f"{getattr(want, '__name__', 'the constraint')}")
                    return
            elif not _attr_equal(got, want):
                self.fail(depth, f"{where}: attribute {key} is {got!r}, the pattern needs "
                                 f"{want!r}")
                return
        if len(p.inputs) != len(node.inputs):
            self.fail(depth, f"{where}: has {len(node.inputs)} operands, the pattern "
                             f"{len(p.inputs)}")
            return
        value = node.outputs[p.output]
        env = _Env(env.bindings, {**env.seen, id(p): value}, env.nodes + tuple(through) + (node,))
        env = env.bind(p.name, value)
        orders = [list(range(len(p.inputs)))]
        if get_op(node.op).commutative and len(p.inputs) == 2:
            orders.append([1, 0])
        for order in orders:
            yield from self._inputs([p.inputs[i] for i in order], list(node.inputs), env,
                                    depth + 1)

    def _inputs(self, pats: list, vals: list, env: _Env, depth: int) -> Iterator[_Env]:
        if not pats:
            yield env
            return
        for found in self.match(pats[0], vals[0], env, depth):
            yield from self._inputs(pats[1:], vals[1:], found, depth + 1)


def _close(a, b, rel_tol: float) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or a == b
    if math.isinf(a) or math.isinf(b):
        return a == b
    return math.isclose(a, b, rel_tol=rel_tol, abs_tol=1e-12)


def _attr_equal(got, want) -> bool:
    if isinstance(want, (list, tuple)):
        return isinstance(got, (list, tuple)) and len(got) == len(want) and all(
            _attr_equal(g, w) for g, w in zip(got, want))
    if isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        return _close(got, want, 1e-6)
    return type(got) is type(want) and got == want


def match_pattern(graph: Graph, pattern: Pattern, node: Node) -> Iterator[MatchResult]:
    """Every way `pattern` matches with its root at `node` (lazily; usually the first is used).

    A root that is a no-op is not looked through: the match is anchored at `node` itself.
    """
    matcher = _Matcher(graph)
    alternatives = pattern.alternatives if isinstance(pattern, AnyOf) else (pattern,)
    env = _Env({}, {}, ())
    found_any = False
    for alt in alternatives:
        if not isinstance(alt, OpPattern) or alt.op != node.op:
            matcher.fail(0, f"{matcher.name(node.outputs[0])} is not {_ops(alt)}")
            continue
        for found in matcher._node(alt, node, env, 0, []):
            found_any = True
            bindings = found.bindings
            if isinstance(pattern, AnyOf) and pattern.name:
                bindings = {**bindings, pattern.name: node.outputs[alt.output]}
            yield MatchResult(True, None, bindings, _unique(found.nodes), node)
    if not found_any:
        yield MatchResult.fail(matcher.failure[1], max(matcher.failure[0], 0))


def _ops(p: Pattern) -> str:
    if isinstance(p, OpPattern):
        return p.op
    if isinstance(p, AnyOf):
        return " or ".join(_ops(a) for a in p.alternatives)
    return type(p).__name__


def _unique(nodes) -> list[Node]:
    seen, out = set(), []
    for n in nodes:
        if id(n) not in seen:
            seen.add(id(n))
            out.append(n)
    return out
