"""Size expressions from a manifest ("s0", "2*s0", "floor(s0/2)"), evaluated without sympy or eval.

The manifest is untrusted data, so its dim strings are parsed with `ast` and walked by a small
interpreter that knows integers, size symbols, + - * / // % ** and sympy's printed functions;
anything else is refused. Arithmetic is exact (fractions), as sympy's is.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Mapping
from fractions import Fraction

from compiler.errors import ArtifactError

_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_FUNCTIONS = {
    "floor": lambda x: Fraction(math.floor(x)), "ceiling": lambda x: Fraction(math.ceil(x)),
    "Mod": operator.mod, "Max": max, "Min": min,
}


def parse_dim(text: str) -> ast.expr:
    """The syntax tree of a dim string; ArtifactError for anything but a size expression."""
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        raise _bad(text) from None
    for node in ast.walk(tree):
        ok = isinstance(node, (ast.BinOp, ast.UnaryOp, ast.Name, ast.Call, ast.Load,
                               ast.USub, ast.UAdd, *_BINARY)) or (
            isinstance(node, ast.Constant) and type(node.value) is int)
        if isinstance(node, ast.Call):
            ok = (isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS
                  and not node.keywords)
        if not ok:
            raise _bad(text)
    return tree


def dim_symbols(text: str) -> set[str]:
    """Size symbols a dim string mentions."""
    nodes = list(ast.walk(parse_dim(text)))
    called = {n.func.id for n in nodes if isinstance(n, ast.Call)}
    return {n.id for n in nodes if isinstance(n, ast.Name)} - called


def eval_dim(text: str, bindings: Mapping[str, int]) -> int:
    """The value of a dim string once its symbols are bound (KeyError names a missing one)."""
    try:
        value = _eval(parse_dim(text), bindings)
    except ZeroDivisionError:
        raise ArtifactError(f"size expression {text!r} divides by zero for {dict(bindings)}",
                            "manifest.json") from None
    if value.denominator != 1:
        raise ArtifactError(f"size expression {text!r} is not an integer for {dict(bindings)}")
    return int(value)


def _eval(node: ast.expr, env: Mapping[str, int]) -> Fraction:
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    if isinstance(node, ast.Name):
        return Fraction(env[node.id])
    if isinstance(node, ast.UnaryOp):
        value = _eval(node.operand, env)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, env), _eval(node.right, env)
        if isinstance(node.op, ast.Pow) and (right.denominator != 1 or abs(right) > 64):
            raise ArtifactError(f"size expression has an unsupported power {right}")
        return Fraction(_BINARY[type(node.op)](left, right))
    args = [_eval(a, env) for a in node.args]  # ast.Call, checked by parse_dim
    return Fraction(_FUNCTIONS[node.func.id](*args))


def _bad(text: str) -> ArtifactError:
    return ArtifactError(f"manifest dim {text!r} is not a size expression", "manifest.json",
                         "the artifact is corrupted; recompile it")
