"""Reads .dzir text (see grammar.lark) into a Graph, checking types as it goes.

Errors carry line and column: a syntax error says what was expected, a type error says which
result type disagrees with the op's shape rule. Nothing in the text is evaluated as code.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import sympy
from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import (
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    UnexpectedToken,
    VisitError,
)

from ..errors import IRParseError
from . import symbolic
from .dtypes import DTYPE_NAMES, DType
from .graph import Graph, Node, Value
from .ops import ShapeError, get_op
from .types import TensorType


@functools.cache
def _lark() -> Lark:
    grammar = (Path(__file__).with_name("grammar.lark")).read_text()
    return Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=True)


def _unquote(token: str) -> str:
    body = token[1:]
    return json.loads(body) if body.startswith('"') else body


@v_args(inline=True)
class _Literals(Transformer):
    """Turns literal and size-expression subtrees into Python values and sympy expressions."""

    def int(self, tok):
        return int(tok)

    def name(self, tok):
        if tok in DTYPE_NAMES:
            return DType(str(tok))
        return symbolic.symbol(str(tok))

    def call(self, fn, *args):
        if fn not in symbolic.FUNCTIONS:
            raise IRParseError(f"unknown size function '{fn}'",
                               f"line {fn.line}, column {fn.column}",
                               f"use one of {sorted(symbolic.FUNCTIONS)}")
        return symbolic.FUNCTIONS[fn](*args)

    def add(self, a, b):
        return a + b

    def sub(self, a, b):
        return a - b

    def mul(self, a, b):
        return a * b

    def truediv(self, a, b):
        return sympy.sympify(a) / b

    def pow(self, a, b):
        return a ** b

    def neg(self, a):
        return -a

    def float(self, tok):
        return float(tok)

    def neg_float(self, tok):
        return -float(tok)

    def string(self, tok):
        return json.loads(tok)

    def true(self):
        return True

    def false(self):
        return False

    def none(self):
        return None

    def list(self, *items):
        return [] if items == (None,) else list(items)


def _value(v):
    """sympy results of constant expressions become ints; everything else stays as parsed."""
    if isinstance(v, sympy.Basic):
        return symbolic.normalize(v)
    if isinstance(v, list):
        return [_value(x) for x in v]
    return v


class _Builder:
    def __init__(self, source: str):
        self.graph = Graph()
        self.source = source
        self.values: dict[str, Value] = {}
        self.literals = _Literals()

    def where(self, meta) -> str:
        return f"{self.source}: line {meta.line}, column {meta.column}"

    def literal(self, tree: Tree, meta):
        """A literal's value; errors inside the transformer come out as IRParseErrors here."""
        try:
            return _value(self.literals.transform(tree))
        except VisitError as exc:
            orig = exc.orig_exc
            if isinstance(orig, IRParseError):
                raise IRParseError(orig.what, f"{self.source}: {orig.where}", orig.fix) from None
            raise IRParseError(f"cannot evaluate size expression: {orig}",
                               self.where(meta)) from None

    def check_attr_symbols(self, key: str, value, meta) -> None:
        """A bare name in an attribute is a dtype or a declared size symbol, nothing else."""
        items = value if isinstance(value, list) else [value]
        for item in items:
            for name in symbolic.free_symbols(item) if isinstance(item, sympy.Basic) else ():
                if name not in self.graph.symbols:
                    raise IRParseError(
                        f"attribute {key}: '{name}' is neither a dtype nor a declared size symbol",
                        self.where(meta),
                        f"use a dtype ({', '.join(sorted(DTYPE_NAMES))}) or declare "
                        f"'symbol {name} in [lo, hi]'")

    def type(self, tree: Tree) -> TensorType:
        dtype_tok, *dims = tree.children
        if dtype_tok not in DTYPE_NAMES:
            raise IRParseError(f"unknown dtype '{dtype_tok}'", self.where(tree.meta),
                               f"use one of {sorted(DTYPE_NAMES)}")
        dims = [] if dims == [None] else dims
        shape = []
        for d in dims:
            dim = self.literal(d, tree.meta)
            for name in symbolic.free_symbols(dim):
                if name not in self.graph.symbols:
                    raise IRParseError(f"size symbol '{name}' is not declared",
                                       self.where(tree.meta), f"add 'symbol {name} in [lo, hi]'")
            shape.append(dim)
        return TensorType(DType(str(dtype_tok)), tuple(shape))

    def ref(self, tree: Tree) -> Value | None:
        if tree.data == "absent":
            return None
        tok = tree.children[0]
        name = _unquote(tok)
        table = self.values if tree.data == "value_ref" else self.graph.weights
        if name not in table:
            kind = "value" if tree.data == "value_ref" else "weight"
            raise IRParseError(f"{kind} '{tok}' is used before it is defined",
                               self.where(tree.meta),
                               "define it earlier (SSA: every value is defined once, before use)")
        return table[name]

    def define(self, tok: Token, type: TensorType, meta) -> Value:
        name = _unquote(tok)
        if name in self.values:
            raise IRParseError(f"value '{tok}' is defined twice", self.where(meta),
                               "give each result a new name")
        value = Value(self.graph._claim(name), type)
        self.values[name] = value
        return value

    def statement(self, stmt: Tree) -> None:
        kind, ch = stmt.data, stmt.children
        if kind == "symbol_decl":
            name, lo, hi = ch
            upper = None if hi.data == "unbounded" else int(hi.children[0])
            self.graph.symbols[str(name)] = (int(lo), upper)
        elif kind == "input_decl":
            self.graph.inputs.append(self.define(ch[0], self.type(ch[1]), stmt.meta))
        elif kind == "weight_decl":
            name = _unquote(ch[0])
            if name in self.graph.weights:
                raise IRParseError(f"weight '{ch[0]}' is declared twice", self.where(stmt.meta))
            self.graph.add_weight(name, self.type(ch[1]))
        elif kind == "node":
            self.node(stmt)
        elif kind == "ret":
            self.graph.outputs = [self.ref(r) for r in ch if r is not None]

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
            attr_values[str(key)] = self.literal(lit, attr.meta)
            self.check_attr_symbols(str(key), attr_values[str(key)], attr.meta)
        declared = [self.type(r.children[1]) for r in results.children]
        try:
            opdef.check_arity(len(inputs))
            attr_values = opdef.complete_attrs(attr_values)
            inferred = opdef.infer([v.type if v is not None else None for v in inputs], attr_values)
        except ShapeError as exc:
            raise IRParseError(f"{op_tok}: {exc}", self.where(stmt.meta)) from None
        for got, want, r in zip(declared, inferred, results.children):
            if not _same_type(got, want):
                raise IRParseError(f"result {r.children[0]} is declared {got} but {op_tok} "
                                   f"gives {want}", self.where(r.meta), f"declare it as {want}")
        if len(declared) != len(inferred):
            raise IRParseError(f"{op_tok} has {len(inferred)} results, {len(declared)} declared",
                               self.where(stmt.meta))
        outputs = [self.define(r.children[0], t, r.meta)
                   for r, t in zip(results.children, declared)]
        where = json.loads(loc.children[0]) if loc is not None else None
        self.graph.nodes.append(Node(str(op_tok), inputs, attr_values, outputs, where))


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
    builder.graph.name = json.loads(name_tok) if name_tok.type == "STRING" else str(name_tok)
    for stmt in stmts:
        builder.statement(stmt)
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
    context = text.splitlines()[line - 1] if 0 < line <= len(text.splitlines()) else ""
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
