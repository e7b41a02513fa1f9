"""What may reach generated kernel source from an artifact's IR: nothing but checked numbers.

The triton backend regenerates its kernels from graph.dzir at load and executes them, and
graph.dzir is as hostile as any file of an artifact (its kernels.json hash is recomputed by
whoever edits it). So no text of the IR is ever written into source: identifiers are the
generator's own (`in0`, `x1`, `v2`, kernel names `k<index>_<op>` with the op from the
generator's op tables), dims are kernel arguments (never source), attribute strings select
entries of tables (`choice`), and numbers are written by `number` only after they are checked
to be real Python ints and floats (NaN and infinities as `float('nan')`, ...).

`check_attrs` refuses, with a DayzeroError naming the node, attributes of the wrong kind on the
ops the generator reads them from. `check_source` is the defense in depth run on the whole
module before it is executed: it parses the text and accepts only the statement and expression
forms the generator writes, `tl.`/`triton.` members from a fixed list, the kernels' own
parameters and locals, and a fixed set of string constants.
"""

from __future__ import annotations

import ast
import builtins
import keyword
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import sympy

from compiler.errors import ArtifactError, DayzeroError
from compiler.ir import OPS, DType, Node
from compiler.ir.ops.fused import ACTIVATIONS


class NotOneKernel(Exception):
    """The nodes cannot form one kernel; the planner splits the group (or runs a host op)."""


_REFUSED_FIX = ("the artifact's graph.dzir was edited or corrupted: recompile the model "
                "with dayzero")


def _refuse(what: str, where: str) -> DayzeroError:
    return DayzeroError(what, where, _REFUSED_FIX)


def _shown(value: Any) -> str:
    """A hostile value as it may appear in a message: repr'd and cut short."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def number(value: Any, attr: str, as_float: bool = False) -> str:
    """The source text of a numeric attribute: the repr of a Python int or float (as the
    generator always wrote them), NaN and infinities as `float(...)` calls. A size expression
    raises NotOneKernel (the op runs on the host, where its symbols are bound); anything else
    is refused."""
    if isinstance(value, sympy.Basic):
        raise NotOneKernel(f"attribute {attr} is a size expression")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _refuse(f"attribute {attr} = {_shown(value)} is not a number", f"attribute {attr}")
    if isinstance(value, int) and not as_float:
        return int.__repr__(int(value))
    x = float(value)
    if math.isnan(x):
        return "float('nan')"
    if math.isinf(x):
        return "float('inf')" if x > 0 else "float('-inf')"
    return float.__repr__(x)


def choice(value: Any, table: Mapping[Any, Any], attr: str) -> Any:
    """`table[value]` for an attribute that selects one of a few behaviours; refused otherwise."""
    if (value is None or isinstance(value, str)) and value in table:
        return table[value]
    raise _refuse(f"attribute {attr} = {_shown(value)} is not one of {sorted(map(str, table))}",
                  f"attribute {attr}")


# -- attribute kinds of the ops the generator reads attributes of ----------------------------

def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, sympy.Basic)) and not isinstance(v, bool)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_dim(v: Any) -> bool:
    return _is_int(v) or isinstance(v, sympy.Basic)


def _rank(node: Node) -> int:
    return max(node.inputs[0].type.rank, 1) if node.inputs and node.inputs[0] else 1


def _is_axis(v: Any, node: Node) -> bool:
    """An axis of the node's first operand, in [-rank, rank) as torch accepts it."""
    return _is_int(v) and -_rank(node) <= v < _rank(node)


def _is_axes(v: Any, node: Node) -> bool:
    """None or [] (every axis), or distinct axes of the node's first operand."""
    return v is None or (isinstance(v, list) and all(_is_axis(d, node) for d in v)
                         and len({d % _rank(node) for d in v}) == len(v))


def _one_of(*allowed: Any) -> tuple[str, Callable[[Any, Node], bool]]:
    return (f"one of {list(allowed)}",
            lambda v, node: (v is None or isinstance(v, str)) and v in allowed)


Kind = tuple[str, Callable[[Any, Node], bool]]
NUMBER: Kind = ("a number", lambda v, node: _is_number(v))
OPTIONAL_NUMBER: Kind = ("a number or none", lambda v, node: v is None or _is_number(v))
AXIS: Kind = ("an axis of its operand", _is_axis)
AXES: Kind = ("a list of distinct axes of its operand", _is_axes)
BOOL: Kind = ("true or false", lambda v, node: isinstance(v, bool))
SIZES: Kind = ("a list of sizes", lambda v, node: isinstance(v, list) and all(map(_is_dim, v)))
DTYPE: Kind = ("a dtype", lambda v, node: isinstance(v, DType))
_REDUCE = {"dims": AXES, "keepdim": BOOL}
# op -> attribute -> kind, for every op the generator writes a kernel for that has attributes
ATTRIBUTES: dict[str, dict[str, Kind]] = {
    "softplus": {"beta": NUMBER, "threshold": NUMBER},
    "leaky_relu": {"negative_slope": NUMBER},
    "elu": {"alpha": NUMBER},
    "clamp": {"min": OPTIONAL_NUMBER, "max": OPTIONAL_NUMBER},
    "cast": {"dtype": DTYPE},
    "sum": _REDUCE, "mean": _REDUCE, "amax": _REDUCE, "amin": _REDUCE,
    "var": {**_REDUCE, "correction": NUMBER},
    "softmax": {"dim": AXIS}, "log_softmax": {"dim": AXIS},
    "layer_norm": {"eps": NUMBER, "normalized_shape": SIZES},
    "rms_norm": {"eps": OPTIONAL_NUMBER, "normalized_shape": SIZES},
    "gelu": {"approximate": _one_of("none", "tanh")},
    "div": {"rounding_mode": _one_of(None, "trunc", "floor")},
    "fused_linear": {"activation": _one_of(*ACTIVATIONS),
                     "weight_layout": _one_of("out_in", "in_out")},
}


def check_attrs(node: Node) -> None:
    """Refuse (DayzeroError) attributes of the wrong kind on a node the generator emits."""
    for attr, (what, ok) in ATTRIBUTES.get(node.op, {}).items():
        value = node.attrs.get(attr)
        if not ok(value, node):
            raise _refuse(f"{node.op}: attribute {attr} = {_shown(value)} is not {what}",
                          f"node {_shown(node.outputs[0].name)} ({node.op})")


# -- identifiers ------------------------------------------------------------------------------

KERNEL_NAME = re.compile(r"k[0-9]{1,9}_[a-z][a-z0-9_]{0,39}")
_OP_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")


def kernel_name(index: int, op: str) -> str:
    """`k<index>_<op>`, for a registered op (the op table's names, not the IR's text) only."""
    if op not in OPS or not _OP_NAME.fullmatch(op) or not _is_int(index) or index < 0:
        raise NotOneKernel(f"no kernel name for op {_shown(op)}")
    return f"k{index}_{op}"


# -- the check of the whole module before it runs --------------------------------------------

HEADER = ("import triton", "import triton.language as tl")
TL_CALLS = frozenset({
    "program_id", "arange", "load", "store", "where", "exp", "exp2", "log", "log2", "sqrt",
    "rsqrt", "sigmoid", "erf", "sin", "cos", "abs", "maximum", "minimum", "floor", "ceil", "sum",
    "max", "min", "zeros", "cdiv", "dot"})
TL_VALUES = frozenset({"float32", "float16", "bfloat16", "int64", "int32", "int1", "constexpr",
                       "PropagateNan"})
NAN_MODE = "tl.PropagateNan.ALL"
METHODS = frozenset({"to"})
CALLS = frozenset({"float", "range"})
KEYWORDS = frozenset({"mask", "other", "axis", "dtype", "input_precision", "propagate_nan"})
FLOAT_STRINGS = frozenset({"inf", "-inf", "nan"})
STRINGS = FLOAT_STRINGS | {"ieee"}
# Every parameter and local name the generators write (codegen.py, emit.py, matmul.py): indexed
# operands, outputs, dims, strides and values, a row reduction's parts (v0_m, v0_s, ...) and the
# fixed names of the two kernel templates. A kernel whose names are not all of these is refused.
GENERATED_NAME = re.compile(
    r"(in|out|n|c|x|v|e|o|nb)[0-9]{1,6}|v[0-9]{1,6}_[mdevs]|s[0-9]{1,6}_[0-9]{1,6}"
    r"|s[ab]_(b[0-9]{1,6}|[mkn])|s[eo][0-9]{1,6}_(b[0-9]{1,6}|[mn])"
    r"|R|N|M|K|BLOCK|BLOCK_[MNK]|GROUP_M|DOT_F32|row|r|mask|offs|t|a|b|pid|num_m|width"
    r"|first_m|rows|rm|rn|rk|pa|pb|acc|k|kk|x|w|v")
_RESERVED = frozenset(dir(builtins)) | frozenset(keyword.kwlist) | {"tl", "triton"}
_EXPRESSIONS = (ast.BinOp, ast.UnaryOp, ast.Compare, ast.Subscript, ast.Slice, ast.Tuple,
                ast.Name, ast.Constant, ast.Call, ast.Attribute)
_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.BitAnd, ast.BitOr,
              ast.BitXor, ast.USub, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Eq, ast.NotEq,
              ast.Load, ast.Store)


class _Unsafe(Exception):
    def __init__(self, node: ast.AST, why: str):
        super().__init__(why)
        self.line, self.why = getattr(node, "lineno", 0), why


def check_source(source: str) -> None:
    """Refuse (ArtifactError) a kernel module holding anything the generator does not write."""
    try:
        tree = ast.parse(source)
        body = tree.body
        header = [ast.unparse(s) for s in body[:len(HEADER)]]
        if tuple(header) != HEADER:
            raise _Unsafe(tree, "the module does not start with the triton imports")
        names: set[str] = set()
        for stmt in body[len(HEADER):]:
            name = _check_kernel(stmt)
            if name in names:
                raise _Unsafe(stmt, f"kernel {name} is defined twice")
            names.add(name)
    except SyntaxError as exc:
        raise _unsafe(exc.lineno or 0, f"it does not parse ({exc.msg})") from None
    except _Unsafe as exc:
        raise _unsafe(exc.line, exc.why) from None


def _unsafe(line: int, why: str) -> ArtifactError:
    return ArtifactError(f"the generated kernel module failed its safety check: {why}",
                         f"generated Triton kernel module, line {line}",
                         "the graph makes the kernel generator write something outside what "
                         "it may write: recompile the model with this dayzero (at compile time "
                         "this is a bug in dayzero; please report it)")


def _check_kernel(stmt: ast.stmt) -> str:
    if not isinstance(stmt, ast.FunctionDef) or not KERNEL_NAME.fullmatch(stmt.name):
        raise _Unsafe(stmt, "a statement other than a kernel definition")
    if [ast.unparse(d) for d in stmt.decorator_list] != ["triton.jit"] or stmt.returns or \
            getattr(stmt, "type_params", None):
        raise _Unsafe(stmt, f"kernel {stmt.name} is not a plain @triton.jit function")
    args = stmt.args
    if args.posonlyargs or args.vararg or args.kwonlyargs or args.kwarg or args.defaults:
        raise _Unsafe(stmt, f"kernel {stmt.name} has a parameter form the generator never uses")
    for arg in args.args:
        if arg.annotation is not None and ast.unparse(arg.annotation) != "tl.constexpr":
            raise _Unsafe(arg, f"parameter {arg.arg} has an annotation other than tl.constexpr")
    params = [a.arg for a in args.args]
    stores = [n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)
              and isinstance(n.ctx, ast.Store)]
    own = set(params) | set(stores)
    bad = sorted(n for n in own if not GENERATED_NAME.fullmatch(n) or n in _RESERVED)
    if bad or len(set(params)) != len(params):
        raise _Unsafe(stmt, f"kernel {stmt.name} has a parameter or local named {bad[:1]}")
    for inner in stmt.body:
        _check_statement(inner, own)
    return stmt.name


def _check_statement(stmt: ast.stmt, own: set[str]) -> None:
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and \
            isinstance(stmt.targets[0], ast.Name):
        _check_expr(stmt.value, own)
    elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name) and \
            isinstance(stmt.op, _OPERATORS):
        _check_expr(stmt.value, own)
    elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        _check_expr(stmt.value, own)
    elif isinstance(stmt, ast.For) and isinstance(stmt.target, ast.Name) and not stmt.orelse \
            and isinstance(stmt.iter, ast.Call) and ast.unparse(stmt.iter.func) == "range":
        _check_expr(stmt.iter, own)
        for inner in stmt.body:
            _check_statement(inner, own)
    elif isinstance(stmt, ast.If) and not stmt.orelse and isinstance(stmt.test, ast.Name):
        _check_expr(stmt.test, own)
        for inner in stmt.body:
            _check_statement(inner, own)
    else:
        raise _Unsafe(stmt, f"a statement the generator never writes ({type(stmt).__name__})")


def _check_expr(expr: ast.AST, own: set[str]) -> None:
    for node in ast.walk(expr):
        if isinstance(node, ast.Call):
            _check_call(node)
        elif isinstance(node, ast.Attribute):
            _check_attribute(node)
        elif isinstance(node, ast.Name):
            if node.id not in own and node.id not in {"tl", *CALLS}:
                raise _Unsafe(node, f"the name {node.id!r} is not the kernel's own")
        elif isinstance(node, ast.Constant):
            _check_constant(node)
        elif isinstance(node, ast.keyword):
            if node.arg not in KEYWORDS:
                raise _Unsafe(node.value, f"the keyword {node.arg!r} is not one the generator "
                                           "writes")
        elif not isinstance(node, (*_EXPRESSIONS, *_OPERATORS)):
            raise _Unsafe(node, f"an expression the generator never writes "
                                 f"({type(node).__name__})")


def _check_call(call: ast.Call) -> None:
    fn = call.func
    if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) and fn.value.id == "tl":
        ok = fn.attr in TL_CALLS
    elif isinstance(fn, ast.Attribute):
        ok = fn.attr in METHODS
    else:
        ok = isinstance(fn, ast.Name) and fn.id in CALLS
    if not ok:
        raise _Unsafe(call, f"a call of {ast.unparse(fn)[:60]!r}, which is not on the list")
    if isinstance(fn, ast.Name) and fn.id == "float" and not (
            len(call.args) == 1 and not call.keywords and isinstance(call.args[0], ast.Constant)
            and call.args[0].value in FLOAT_STRINGS):
        raise _Unsafe(call, "float() of anything but 'inf', '-inf' or 'nan'")


def _check_attribute(node: ast.Attribute) -> None:
    if isinstance(node.value, ast.Name) and node.value.id == "tl":
        if node.attr in TL_CALLS or node.attr in TL_VALUES:
            return
    elif node.attr in METHODS or ast.unparse(node) == NAN_MODE:
        return
    raise _Unsafe(node, f"the attribute {ast.unparse(node)[:60]!r} is not on the list")


def _check_constant(node: ast.Constant) -> None:
    value = node.value
    if value is None or (isinstance(value, str) and value in STRINGS):
        return
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return
    raise _Unsafe(node, f"the constant {_shown(value)} is not a number or a listed string")
