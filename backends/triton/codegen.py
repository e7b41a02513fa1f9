"""Generate one `@triton.jit` kernel from a group of IR nodes.

A kernel iterates over one domain F (a shape, symbolic dims allowed): an elementwise kernel over
all of F in blocks, a row kernel (a group with reductions, norms or softmax over F's trailing
dims) one program per row with the row in one block. Every value inside is computed at the
element's coordinates in F; operands are loaded through their strides broadcast to F (stride 0
on broadcast dims), which the launcher reads from the actual tensors. Sizes and strides are
kernel arguments, never constants, so one kernel serves every value of the size symbols; the
source depends only on the IR, which makes it reproducible at load time (see `backends.triton`).
No IR name or dim is ever written into the source (see `source_guard`): identifiers are the
generator's own (`in0`, `x0`, `v1`, `n0`, `s0_1`, ...), value names stay in `Kernel`'s fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sympy

from compiler.ir import DType, Node, TensorType, Value
from compiler.ir.symbolic import equal, product

from .emit import (
    BOOL_OPS,
    ELEMENTWISE,
    INT_IDENTITY,
    POW_EXPONENTS,
    ROW_OPS,
    VECTOR_RESULT,
    row_lines,
)
from .source_guard import NotOneKernel, check_attrs

TL_DTYPES = {DType.f32: "tl.float32", DType.f16: "tl.float16", DType.bf16: "tl.bfloat16",
             DType.i64: "tl.int64", DType.i32: "tl.int32", DType.bool: "tl.int1"}
_FLOATS = (DType.f32, DType.f16, DType.bf16)


@dataclass(frozen=True)
class Kernel:
    """A generated kernel and what its launcher needs to know (all JSON-serializable names)."""

    name: str
    source: str
    nodes: tuple[str, ...]        # first output of each member node, in order
    inputs: tuple[str, ...]       # value names, in argument order
    outputs: tuple[str, ...]
    domain: tuple[object, ...]    # F: dims (int or sympy), evaluated at launch
    reduced: int                  # trailing dims of F reduced per row (0: elementwise kernel)
    perm: tuple[int, ...] = ()    # launch on inputs[0].permute(perm) (reduced dims moved last)
    unpermute: bool = False       # the output is in permuted order too (softmax): permute back


def broadcast(shapes: Sequence[Sequence[object]]) -> tuple[object, ...]:
    """The symbolic broadcast of shapes: per dim from the right, the dim that is not 1."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(1, rank + 1):
        dims = [s[-i] for s in shapes if len(s) >= i]
        big = [d for d in dims if not equal(d, 1)]
        out.append(big[0] if big else 1)
    return tuple(reversed(out))


def _fits(shape: Sequence[object], domain: Sequence[object]) -> bool:
    if len(shape) > len(domain):
        return False
    return all(equal(d, 1) or equal(d, f) for d, f in zip(reversed(shape), reversed(domain)))


def _trailing(node: Node) -> int:
    """How many trailing dims of its input a row op reduces; NotOneKernel if not trailing."""
    rank = node.inputs[0].type.rank
    if rank == 0:
        return 1  # one row of one element: plan_domain makes F [1]
    if node.op in ("softmax", "log_softmax"):
        dims = [node.attrs["dim"] % rank]
    elif node.op in ("layer_norm", "rms_norm"):
        return len(node.attrs["normalized_shape"])
    else:
        dims = sorted(d % rank for d in node.attrs["dims"]) if node.attrs["dims"] else \
            list(range(rank))
    if dims != list(range(rank - len(dims), rank)):
        raise NotOneKernel(f"{node.op} reduces dims {dims}, not the trailing ones")
    return len(dims)


def plan_domain(nodes: Sequence[Node]) -> tuple[tuple[object, ...], int]:
    """(F, reduced trailing dims) of a would-be kernel."""
    rows = [n for n in nodes if n.op in ROW_OPS]
    if not rows:
        return broadcast([n.outputs[0].shape for n in nodes]), 0
    domain = tuple(rows[0].inputs[0].shape) or (1,)
    reduced = _trailing(rows[0])
    for node in rows[1:]:
        if not (equal(product(node.inputs[0].shape), product(domain))
                and _trailing(node) == reduced and _fits(node.inputs[0].shape, domain)):
            raise NotOneKernel(f"%{node.output.name} reduces another domain")
    return domain, reduced


class _KernelSourceWriter:
    def __init__(self, name: str, inputs: Sequence[Value], outputs: Sequence[Value],
                 domain: tuple[object, ...], reduced: int, constants: Mapping[str, float]):
        self.name, self.inputs, self.outputs = name, list(inputs), list(outputs)
        self.domain, self.reduced, self.constants = domain, reduced, constants
        self.rank = len(domain)
        self.rows = product(domain[:self.rank - reduced]) if reduced else None
        self.expr: dict[int, str] = {}
        self.is_row: dict[int, bool] = {}
        self.lines: list[str] = []

    def header(self) -> list[str]:
        ins = [f"in{i}" for i in range(len(self.inputs))]
        outs = [f"out{j}" for j in range(len(self.outputs))]
        dims = [f"n{d}" for d in range(self.rank)]
        strides = [f"s{i}_{d}" for i in range(len(self.inputs)) for d in range(self.rank)]
        count = "R" if self.reduced else "N"
        args = ", ".join([*ins, *outs, *dims, *strides, count, "BLOCK: tl.constexpr"])
        lines = ["@triton.jit", f"def {self.name}({args}):"]
        if self.reduced:
            lines += ["    row = tl.program_id(0)", "    r = tl.arange(0, BLOCK)",
                      "    mask = r < R", "    offs = row * R + r"]
        else:
            lines += ["    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
                      "    mask = offs < N"]
        lines += ["    t = offs"]
        for d in reversed(range(self.rank)):
            lines.append(f"    c{d} = t % n{d}")
            if d:
                lines.append(f"    t = t // n{d}")
        return lines

    def load_inputs(self) -> None:
        for i, value in enumerate(self.inputs):
            if not _fits(value.shape, self.domain):
                raise NotOneKernel(f"%{value.name} does not broadcast to the kernel domain")
            terms = [f"c{d} * s{i}_{d}" for d in range(self.rank)] or ["offs * 0"]
            load = f"tl.load(in{i} + {' + '.join(terms)}, mask=mask, other=0)"
            if value.dtype in _FLOATS:
                load += ".to(tl.float32)"
            self.lines.append(f"x{i} = {load}")
            self.expr[id(value)], self.is_row[id(value)] = f"x{i}", False

    def node(self, k: int, node: Node) -> None:
        out = node.outputs[0]
        args = [None if v is None else self.expr.get(id(v)) for v in node.inputs]
        needed = node.inputs[:1] if node.op == "pow" else node.inputs  # exponent is inlined
        if any(a is None for a, v in zip(args, needed) if v is not None):
            raise NotOneKernel(f"%{out.name} reads a value the kernel does not have")
        var = f"v{k}"
        if node.op in ("expand", "reshape"):
            self._alias(node, args[0])
            return
        if node.op in ROW_OPS:
            if not self.reduced or self.is_row[id(node.inputs[0])]:
                raise NotOneKernel(f"%{out.name}: {node.op} of a per-row value")
            self.lines += row_lines(node.op, var, args[0], args[1:], node.attrs)
            self.is_row[id(out)] = node.op not in VECTOR_RESULT
        else:
            self.lines.append(f"{var} = {self._elementwise(node, args)}")
            self.is_row[id(out)] = all(self.is_row[id(v)] for v in needed if v is not None)
        self.expr[id(out)] = var

    def _alias(self, node: Node, arg: str) -> None:
        src, out = node.inputs[0], node.outputs[0]
        same = equal(product(src.shape), product(self.domain)) or self.is_row[id(src)] or \
            node.op == "expand"
        if not same:
            raise NotOneKernel(f"%{out.name}: reshape of a broadcast value inside a kernel")
        self.expr[id(out)], self.is_row[id(out)] = arg, self.is_row[id(src)]

    def _elementwise(self, node: Node, args: list[str]) -> str:
        if node.op == "pow":
            exponent = self.constants.get(node.inputs[1].name)
            if exponent not in POW_EXPONENTS:
                raise NotOneKernel(f"%{node.output.name}: pow with exponent {exponent}")
            return POW_EXPONENTS[exponent].format(args[0])
        if node.op == "cast":
            return _cast(args[0], node.inputs[0].dtype, node.output.dtype)
        op = node.op
        if node.output.dtype == DType.bool and op in BOOL_OPS:
            op = BOOL_OPS[op]
        if op in INT_IDENTITY and node.inputs[0].dtype not in _FLOATS:
            return args[0]
        if op not in ELEMENTWISE:
            raise NotOneKernel(f"op {op} has no Triton expression")
        if node.op == "div" and node.attrs.get("rounding_mode") is not None:
            raise NotOneKernel("div with a rounding mode")
        return ELEMENTWISE[op](args, node.attrs)

    def store_outputs(self) -> None:
        for j, value in enumerate(self.outputs):
            expr, row = self.expr[id(value)], self.is_row[id(value)]
            typed = f"({expr}).to({TL_DTYPES[value.dtype]})"
            numel = product(value.shape)
            if not row and equal(numel, product(self.domain)):
                self.lines.append(f"tl.store(out{j} + offs, {typed}, mask=mask)")
            elif self.reduced and equal(numel, self.rows):
                if row:
                    self.lines.append(f"tl.store(out{j} + row, {typed})")
                else:
                    self.lines.append(f"tl.store(out{j} + row + r * 0, {typed}, mask=r == 0)")
            else:
                raise NotOneKernel(f"%{value.name} is neither per element nor per row")

    def source(self) -> str:
        return "\n".join([*self.header(), *("    " + line for line in self.lines)]) + "\n"


def _cast(expr: str, src: DType, dst: DType) -> str:
    if dst == DType.bool:
        return f"({expr} != 0)"
    if dst in _FLOATS:
        return f"({expr}).to(tl.float32)"
    if dst not in TL_DTYPES:
        raise NotOneKernel(f"cast to {dst.value}")
    return f"({expr}).to({TL_DTYPES[dst]})"


def generate(name: str, nodes: Sequence[Node], inputs: Sequence[Value],
             outputs: Sequence[Value], constants: Mapping[str, float]) -> Kernel:
    """The kernel computing `nodes` from `inputs` and storing `outputs`; raises NotOneKernel.

    `constants` maps names of 0-d constant values to their numbers (for pow exponents)."""
    for node in nodes:
        check_attrs(node)
    for value in [*inputs, *outputs]:
        if value.dtype not in TL_DTYPES:
            raise NotOneKernel(f"%{value.name} has dtype {value.dtype.value}")
    domain, reduced = plan_domain(nodes)
    writer = _KernelSourceWriter(name, inputs, outputs, domain, reduced, constants)
    writer.load_inputs()
    for k, node in enumerate(nodes):
        writer.node(k, node)
    writer.store_outputs()
    dims = tuple(d if isinstance(d, int) else sympy.sympify(d) for d in domain)
    return Kernel(name, writer.source(), tuple(n.outputs[0].name for n in nodes),
                  tuple(v.name for v in inputs), tuple(v.name for v in outputs), dims, reduced)


_PERMUTABLE = frozenset({"sum", "mean", "amax", "amin", "var", "softmax", "log_softmax"})


def generate_permuted(name: str, node: Node) -> Kernel:
    """A row kernel for a reduction or softmax over non-trailing dims: the launcher permutes
    the input (a strided view, no copy) so the reduced dims come last."""
    if node.op not in _PERMUTABLE:
        raise NotOneKernel(f"{node.op} over non-trailing dims")
    check_attrs(node)
    x, out = node.inputs[0], node.outputs[0]
    rank = x.type.rank
    if node.op in ("softmax", "log_softmax"):
        dims = [node.attrs["dim"] % max(rank, 1)]
        attrs = {**node.attrs, "dim": -1}
    else:
        dims = sorted(d % rank for d in node.attrs["dims"]) or list(range(rank))
        attrs = {**node.attrs, "dims": list(range(rank - len(dims), rank))}
    perm = tuple([d for d in range(rank) if d not in dims] + dims)
    px = Value(x.name, TensorType(x.dtype, tuple(x.shape[p] for p in perm)))
    unpermute = node.op in ("softmax", "log_softmax")
    out_type = TensorType(out.dtype, tuple(out.shape[p] for p in perm)) if unpermute else out.type
    py = Value(out.name, out_type)
    kernel = generate(name, [Node(node.op, [px], attrs, [py], node.loc)], [px], [py], {})
    return dataclasses.replace(kernel, perm=perm, unpermute=unpermute)
