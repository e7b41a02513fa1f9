"""Reads .dzir text (see grammar.lark) into a Graph, checking types as it goes.

Errors carry line and column: a syntax error says what was expected, a type error says which
result type disagrees with the op's shape rule. Nothing in the text is evaluated as code.
"""

from __future__ import annotations

import functools
from pathlib import Path

import sympy
from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from ..errors import IRParseError
from . import symbolic
from .dtypes import DTYPE_NAMES, DType
from .graph import Graph, Node, Value
from .limits import MAX_SIMPLIFY_CALLS
from .literals import Evaluator, integer, position, string
from .ops import ShapeError, get_op
from .types import TensorType


@functools.cache
def _lark() -> Lark:
    grammar = (Path(__file__).with_name("grammar.lark")).read_text()
    return Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=True)


def _unquote(token: Token, source: str) -> str:
    body = token[1:]
    return string(Token(token.type, body, line=token.line, column=token.column), source) \
        if body.startswith('"') else body


class _Builder:
    def __init__(self, source: str):
        self.graph = Graph()
        self.source = source
        self.values: dict[str, Value] = {}
        self.literals = Evaluator(source)
        self.returned = False

    def where(self, meta) -> str:
        return f"{self.source}: line {meta.line}, column {meta.column}"

    def check_attr_symbols(self, key: str, value, meta) -> None:
        """A bare name in an attribute is a dtype or a declared size symbol, nothing else."""
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, list):
                self.check_attr_symbols(key, item, meta)
                continue
            if not isinstance(item, sympy.Basic):
                continue
            for name in symbolic.free_symbols(item):
                if name not in self.graph.symbols:
                    raise IRParseError(
                        f"attribute {key}: '{name}' is neither a dtype nor a declared size symbol",
                        self.where(meta),
                        f"use a dtype ({', '.join(sorted(DTYPE_NAMES))}) or declare "
                        f"'symbol {name} in [lo, hi]'")
            self.check_ends(item, f"attribute {key}", self.where(meta), size=False)

    def type(self, tree: Tree) -> TensorType:
        dtype_tok, *dims = tree.children
        if dtype_tok not in DTYPE_NAMES:
            raise IRParseError(f"unknown dtype '{dtype_tok}'", self.where(tree.meta),
                               f"use one of {sorted(DTYPE_NAMES)}")
        dims = [] if dims == [None] else dims
        shape = []
        for d in dims:
            dim = self.literals.dim(d)
            names = symbolic.free_symbols(dim)
            for name in names:
                if name not in self.graph.symbols:
                    raise IRParseError(f"size symbol '{name}' is not declared",
                                       f"{self.source}: {position(d)}",
                                       f"add 'symbol {name} in [lo, hi]'")
            if names:
                self.check_ends(dim, "dim", f"{self.source}: {position(d)}")
            shape.append(dim)
        return TensorType(DType(str(dtype_tok)), tuple(shape))

    def check_ends(self, expr, what: str, where: str, size: bool = True) -> None:
        """A symbolic dim or attribute must have a value at one end of its symbols' ranges at
        least: a division by zero at both (Mod(s0, 1), Min(s0, 0) in a divisor, zero for every
        size although sympy does not see it) is no value. A dim also must not be negative at
        both ends (at the lower end alone it may be: the frontend records 0 as a lower bound
        where torch's range starts at 0, for a dim such as s0 - 1). Where a range has no upper
        end, lo + 1 stands for it. Evaluating costs one counted walk of the expression."""
        ranges = {name: self.graph.symbols[name] for name in symbolic.free_symbols(expr)}
        if not ranges:
            return
        ends = [{n: r[0] for n, r in ranges.items()},
                {n: r[0] + 1 if r[1] is None else r[1] for n, r in ranges.items()}]
        values = [self._value_at(expr, end, what, where) for end in ends]
        if all(v is None for v in values):
            raise IRParseError(f"{what} {expr} divides by zero at both ends of its symbols' "
                               f"ranges ({ends[0]}, {ends[1]})", where,
                               "fix the expression or the symbols' ranges")
        bounded = all(r[1] is not None for r in ranges.values())
        if size and bounded and all(v is not None and v < 0 for v in values):
            raise IRParseError(f"{what} {expr} is negative over its symbols' ranges "
                               f"({values[0]} at {ends[0]}, {values[1]} at {ends[1]})", where,
                               "fix the expression or the symbols' ranges")

    def _value_at(self, expr, end: dict[str, int], what: str, where: str):
        """The value at `end`, None where it divides by zero (counted work, no sympy)."""
        try:
            return symbolic.evaluate(expr, end)
        except (ZeroDivisionError, TypeError):
            return None
        except ValueError as exc:  # past MAX_EVAL_STEPS or MAX_VALUE_BITS
            raise IRParseError(f"{what} {expr} cannot be evaluated: {exc}", where) from None

    def ref(self, tree: Tree) -> Value | None:
        if tree.data == "absent":
            return None
        tok = tree.children[0]
        name = _unquote(tok, self.source)
        table = self.values if tree.data == "value_ref" else self.graph.weights
        if name not in table:
            kind = "value" if tree.data == "value_ref" else "weight"
            raise IRParseError(f"{kind} '{tok}' is used before it is defined",
                               self.where(tree.meta),
                               "define it earlier (SSA: every value is defined once, before use)")
        return table[name]

    def define(self, tok: Token, type: TensorType, meta) -> Value:
        name = _unquote(tok, self.source)
        if name in self.values:
            raise IRParseError(f"value '{tok}' is defined twice", self.where(meta),
                               "give each result a new name")
        value = Value(self.graph._claim(name), type)
        self.values[name] = value
        return value

    def symbol(self, stmt: Tree) -> None:
        name, lo, hi = stmt.children
        lower = integer(lo, self.source)
        upper = None if hi.data == "unbounded" else integer(hi.children[0], self.source)
        if str(name) in self.graph.symbols:
            raise IRParseError(f"symbol {name} is declared twice", self.where(stmt.meta))
        if str(name) in DTYPE_NAMES:
            raise IRParseError(f"symbol {name} has the name of a dtype", self.where(stmt.meta),
                               "name size symbols s0, s1, ...")
        if upper is not None and lower > upper:
            raise IRParseError(f"symbol {name} has the empty range [{lower}, {upper}]",
                               self.where(stmt.meta), "write the range as [lo, hi] with lo <= hi")
        self.graph.symbols[str(name)] = (lower, upper)

    def statement(self, stmt: Tree) -> None:
        kind, ch = stmt.data, stmt.children
        if self.returned:
            what = "a second `return`" if kind == "ret" else kind.replace("_decl", "")
            raise IRParseError(f"{what} after `return`",
                               self.where(stmt.meta), "`return` is the graph's last statement")
        if kind == "symbol_decl":
            self.symbol(stmt)
        elif kind == "input_decl":
            self.graph.inputs.append(self.define(ch[0], self.type(ch[1]), stmt.meta))
        elif kind == "weight_decl":
            name = _unquote(ch[0], self.source)
            if name in self.graph.weights:
                raise IRParseError(f"weight '{ch[0]}' is declared twice", self.where(stmt.meta))
            self.graph.add_weight(name, self.type(ch[1]))
        elif kind == "node":
            self.node(stmt)
        elif kind == "ret":
            self.graph.outputs = [self.ref(r) for r in ch if r is not None]
            self.returned = True

    def node(self, stmt: Tree) -> None:
        results, op_tok, args, attrs, loc = stmt.children
        try:
            opdef = get_op(str(op_tok))
        except ShapeError as exc:
            raise IRParseError(str(exc), self.where(stmt.meta),
                               "see docs/ops.md for the op set") from None
        inputs = [self.ref(a) for a in (args.children if args is not None else [])]
        attr_values = {}
        for attr in (attrs.children if attrs is not None else []):
            if attr is None:
                continue
            key, lit = attr.children
            attr_values[str(key)] = self.literals.literal(lit)
            self.check_attr_symbols(str(key), attr_values[str(key)], attr.meta)
        declared = [self.type(r.children[1]) for r in results.children]
        try:
            opdef.check_arity(len(inputs))
            attr_values = opdef.complete_attrs(attr_values)
            inferred = opdef.infer([v.type if v is not None else None for v in inputs], attr_values)
            mismatch = next(((got, want, r) for got, want, r in
                             zip(declared, inferred, results.children)
                             if not _same_type(got, want)), None)
        except ShapeError as exc:
            raise IRParseError(f"{op_tok}: {exc}", self.where(stmt.meta)) from None
        except Exception as exc:  # noqa: BLE001 - a shape rule that fails on odd operands
            what, fix = rule_failure(opdef, inputs, exc)
            raise IRParseError(what, self.where(stmt.meta), fix) from None
        for want in inferred:
            bad = next((d for d in want.shape if not symbolic.is_size(d)), None)
            if bad is not None:
                raise IRParseError(f"{op_tok} gives a result of type {want}, whose dim {bad} is "
                                   "not a size", self.where(stmt.meta),
                                   "check the attributes (a step of 0, a negative size?)")
        if mismatch is not None:
            got, want, r = mismatch
            raise IRParseError(f"result {r.children[0]} is declared {got} but {op_tok} "
                               f"gives {want}", self.where(r.meta), f"declare it as {want}")
        if len(declared) != len(inferred):
            raise IRParseError(f"{op_tok} has {len(inferred)} results, {len(declared)} declared",
                               self.where(stmt.meta))
        outputs = [self.define(r.children[0], t, r.meta)
                   for r, t in zip(results.children, declared)]
        where = string(loc.children[0], self.source) if loc is not None else None
        self.graph.insert_node(Node(str(op_tok), inputs, attr_values, outputs, where))


def rule_failure(opdef, inputs, exc: Exception) -> tuple[str, str]:
    """(what, fix) for an op's shape rule that raised something other than a ShapeError: the
    operands or attributes are outside what the rule handles (missing optional operands,
    attributes of the wrong kind)."""
    fixed = [p for p in opdef.inputs if not p.endswith("*")]
    if len(inputs) < len(fixed):
        return (f"{opdef.name} takes inputs ({', '.join(opdef.inputs)}), got {len(inputs)}",
                "write `_` for an absent optional input")
    return (f"{opdef.name}: its operands or attributes are not ones it accepts "
            f"({type(exc).__name__}: {str(exc)[:200]})",
            f"see docs/ops.md for what {opdef.name} takes")


def _same_type(a: TensorType, b: TensorType) -> bool:
    return a.dtype == b.dtype and a.rank == b.rank and all(
        symbolic.equal(x, y) for x, y in zip(a.shape, b.shape))


def parse_ir(text: str, source: str = "<dzir>") -> Graph:
    """Parse .dzir text; raises IRParseError naming line, column and what was expected."""
    try:
        tree = _lark().parse(text)
    except UnexpectedInput as exc:
        raise _syntax_error(exc, text, source) from None
    builder = _Builder(source)
    name_tok, *stmts = tree.children
    builder.graph.name = string(name_tok, source) if name_tok.type == "STRING" else str(name_tok)
    with symbolic.bounded_simplify(MAX_SIMPLIFY_CALLS):
        for stmt in stmts:
            builder.statement(stmt)
    if not builder.returned:
        lines = text.split("\n")
        raise IRParseError("the graph has no `return` statement",
                           f"{source}: line {len(lines)}, column 1",
                           "end the graph with `return` and its outputs (`return` alone for none)")
    return builder.graph


def _syntax_error(exc: UnexpectedInput, text: str, source: str) -> IRParseError:
    line, column = getattr(exc, "line", 0), getattr(exc, "column", 0)
    if isinstance(exc, UnexpectedToken):
        found = "end of input" if exc.token.type == "$END" else repr(str(exc.token))
        expected = sorted(exc.expected)
    elif isinstance(exc, UnexpectedCharacters):
        found = repr(text[exc.pos_in_stream]) if exc.pos_in_stream < len(text) else "end of input"
        expected = sorted(exc.allowed or [])
    elif isinstance(exc, UnexpectedEOF):
        found, expected = "end of input", sorted(exc.expected)
    else:
        found, expected = "?", []
    lines = text.split("\n")  # lines as the lexer counts them (not at form feeds etc.)
    context = lines[line - 1].rstrip("\r") if 0 < line <= len(lines) else ""
    pointer = f"\n    {context}\n    {' ' * max(column - 1, 0)}^" if context else ""
    names = ", ".join(_describe(e) for e in expected[:8])
    return IRParseError(f"syntax error: unexpected {found}{pointer}",
                        f"{source}: line {line}, column {column}",
                        f"expected one of: {names}" if names else None)


def _describe(terminal: str) -> str:
    try:
        pattern = _lark().get_terminal(terminal).pattern
    except KeyError:
        return terminal
    return repr(pattern.value) if pattern.type == "str" else terminal
