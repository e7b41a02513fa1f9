"""Size expressions from a manifest ("s0", "2*s0", "floor(s0/2)"), evaluated without sympy or eval.

The manifest is untrusted data, so its dim strings are parsed with `ast` and walked by a small
interpreter that knows integers, size symbols, + - * / // % ** and sympy's printed functions;
anything else is refused. Arithmetic is exact (fractions), as sympy's is.
"""

from __future__ import annotations

import ast
import functools
import math
import operator
from collections.abc import Mapping
from fractions import Fraction

from compiler.errors import ArtifactError
from compiler.ir.limits import (
    MAX_DEGREE,
    MAX_DEPTH,
    MAX_DIM_CHARS,
    MAX_EXPONENT,
    MAX_INT,
    MAX_NODES,
)

_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_FUNCTIONS = {
    "floor": lambda x: Fraction(math.floor(x)), "ceiling": lambda x: Fraction(math.ceil(x)),
    "Mod": operator.mod, "Max": max, "Min": min,
}


_ARITY = {"floor": (1, 1), "ceiling": (1, 1), "Mod": (2, 2), "Max": (1, 16), "Min": (1, 16)}
_NODES = (ast.BinOp, ast.UnaryOp, ast.Name, ast.Call, ast.Load, ast.USub, ast.UAdd, *_BINARY)


def parse_dim(text: str) -> ast.expr:
    """The syntax tree of a dim string; ArtifactError for anything but a size expression.

    Checked within `compiler.ir.limits` before anything is evaluated: length, nesting, number
    of operations, integer constants below 2**63, powers only with a constant exponent of at
    most MAX_EXPONENT and never of another power, polynomial degree at most MAX_DEGREE.
    """
    if not isinstance(text, str) or len(text) > MAX_DIM_CHARS:
        raise _bad(text if isinstance(text, str) else repr(text)[:40],
                   f"more than {MAX_DIM_CHARS} characters" if isinstance(text, str) else None)
    return _parsed(text)


@functools.lru_cache(maxsize=4096)
def _parsed(text: str) -> ast.expr:
    """parse_dim's work, once per dim string: a loaded model validates its inputs and checks
    its outputs against the same few strings on every call (a failure is not cached)."""
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise _bad(text) from None
    _check(tree, text)
    return tree


def _check(tree: ast.expr, text: str) -> None:
    """Walk the tree (without recursion: ast.parse accepts deeper trees than Python recursion)
    checking node kinds, depth and count; then the degree, with recursion at bounded depth."""
    stack, count = [(tree, 0)], 0
    while stack:
        node, depth = stack.pop()
        count += 1
        if depth > MAX_DEPTH or count > MAX_NODES:
            raise _bad(text, f"nested more than {MAX_DEPTH} deep" if depth > MAX_DEPTH
                       else f"more than {MAX_NODES} operations")
        ok = isinstance(node, _NODES) or (
            isinstance(node, ast.Constant) and type(node.value) is int and node.value < MAX_INT)
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else None
            lo, hi = _ARITY.get(name, (1, 0))
            ok = not node.keywords and lo <= len(node.args) <= hi
        if not ok:
            raise _bad(text)
        children = node.args if isinstance(node, ast.Call) else list(ast.iter_child_nodes(node))
        stack.extend((child, depth + 1) for child in children)
    if _degree(tree, text) > MAX_DEGREE:
        raise _bad(text, f"degree above {MAX_DEGREE} in its symbols")


def _degree(node: ast.expr, text: str) -> int:
    """Polynomial degree in the size symbols, as compiler.ir.literals counts it: a power's
    exponent is an integer constant from 0 to MAX_EXPONENT, and `(s0**2 + 1)**2` (sympy's
    printed form of a square it did not expand) has degree 4."""
    if isinstance(node, ast.Constant):
        return 0
    if isinstance(node, ast.Name):
        return 1
    if isinstance(node, ast.UnaryOp):
        return _degree(node.operand, text)
    if isinstance(node, ast.Call):
        return max(_degree(a, text) for a in node.args)
    left, right = _degree(node.left, text), _degree(node.right, text)
    if not isinstance(node.op, ast.Pow):
        return max(left, right) if isinstance(node.op, (ast.Add, ast.Sub)) else left + right
    exponent = node.right
    if not (isinstance(exponent, ast.Constant) and 0 <= exponent.value <= MAX_EXPONENT):
        raise ArtifactError(f"size expression {text[:80]!r} has an unsupported power (an "
                            f"integer constant from 0 to {MAX_EXPONENT})", "manifest.json",
                            "the artifact is corrupted; recompile it")
    degree = left * exponent.value
    if degree > MAX_DEGREE:  # refused here, before a tower's degree is multiplied further
        raise _bad(text, f"degree above {MAX_DEGREE} in its symbols")
    return degree


def dim_symbols(text: str) -> frozenset[str]:
    """Size symbols a dim string mentions."""
    nodes = list(ast.walk(parse_dim(text)))
    called = {n.func.id for n in nodes if isinstance(n, ast.Call)}
    return frozenset({n.id for n in nodes if isinstance(n, ast.Name)} - called)


def eval_dim(text: str, bindings: Mapping[str, int]) -> int:
    """The value of a dim string once its symbols are bound (KeyError names a missing one)."""
    try:
        value = _eval(parse_dim(text), bindings, text)
    except ZeroDivisionError:
        raise ArtifactError(f"size expression {text!r} divides by zero for {dict(bindings)}",
                            "manifest.json") from None
    if value.denominator != 1:
        raise ArtifactError(f"size expression {text!r} is not an integer for {dict(bindings)}")
    return int(value)


def _eval(node: ast.expr, env: Mapping[str, int], text: str) -> Fraction:
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    if isinstance(node, ast.Name):
        return _bounded(Fraction(env[node.id]), text)
    if isinstance(node, ast.UnaryOp):
        value = _eval(node.operand, env, text)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, env, text), _eval(node.right, env, text)
        return _bounded(Fraction(_BINARY[type(node.op)](left, right)), text)
    args = [_eval(a, env, text) for a in node.args]  # ast.Call, checked by parse_dim
    return _bounded(Fraction(_FUNCTIONS[node.func.id](*args)), text)


def _bounded(value: Fraction, text: str) -> Fraction:
    """Every intermediate value stays below 2**63 (operands are, so each step is cheap)."""
    if abs(value.numerator) >= MAX_INT or value.denominator >= MAX_INT:
        raise ArtifactError(f"size expression {text[:80]!r} is too large (a value past 2**63)",
                            "manifest.json", "the artifact or the input sizes are wrong")
    return value


def _bad(text: str, why: str | None = None) -> ArtifactError:
    return ArtifactError(f"manifest dim {text[:80]!r} is not a size expression"
                         + (f" ({why})" if why else ""), "manifest.json",
                         "the artifact is corrupted; recompile it")
