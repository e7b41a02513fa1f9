"""Generate a tiled GEMM `@triton.jit` kernel for matmul / linear / fused_linear, epilogue fused.

One template covers the three ops: C = A @ B over BLOCK_M x BLOCK_N output tiles, walking K in
BLOCK_K steps with `tl.dot` into an fp32 accumulator; masks cover ragged edges. Every size and
stride is a kernel argument, so one kernel serves every value of the size symbols, and an
`out_in` weight ([N, K]) is read through swapped strides instead of being transposed. When B is
2-D, A's leading dims fold into M (a [b, s, K] activation is one [b*s, K] GEMM); when B is
batched too, the leading dims of the result run on the grid's second axis, each operand reaching
its batch through its own strides (0 on a broadcast dim, so nothing is expanded in memory).

The epilogue runs on the accumulator tile before the single store: the bias, the fused_linear
activation and, when the planner hands one over, the elementwise unit that is the result's only
consumer (a residual add, SwiGLU's `silu(gate) * up`). Its expressions come from `emit.py`, the
same table the elementwise kernels use. Like `codegen.py`, the source is a pure function of the
IR, so it is regenerated identically at load time; block sizes and warps are launch parameters
(`autotune.py`), not part of the source. No IR name, dim or attribute text is written into it
(`source_guard`): the activation selects an entry of the `ACTIVATIONS` table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sympy

from compiler.ir import DType, Node, Value
from compiler.ir.ops.fused import ACTIVATIONS
from compiler.ir.symbolic import equal

from .emit import ELEMENTWISE, POW_EXPONENTS
from .source_guard import NotOneKernel, check_attrs, choice

MATMUL_OPS = frozenset({"matmul", "linear", "fused_linear"})
TL_FLOATS = {DType.f32: "tl.float32", DType.f16: "tl.float16", DType.bf16: "tl.bfloat16"}
GROUP_M = 8  # output tile rows swept together, so neighbouring programs share A and B in cache

# Which operand layout each op has: in_out reads B as [.., K, N], out_in as [N, K] (transposed).
_LAYOUT = {"matmul": "in_out", "linear": "out_in"}
_NOT_EPILOGUE = frozenset({"cast", "where"})  # casts round between dtypes; where takes a bool


@dataclass(frozen=True)
class MatmulKernel:
    """A generated GEMM kernel and what its launcher needs (all names and IR dims)."""

    name: str
    source: str
    nodes: tuple[str, ...]       # first output of the matmul node, then of each epilogue node
    inputs: tuple[str, ...]      # A, B, then the epilogue operands, in argument order
    outputs: tuple[str, ...]
    shape: tuple[object, ...]    # the matmul result's shape (int or sympy), evaluated at launch
    transposed: bool             # B is an out_in weight [N, K]
    batch: int                   # leading result dims on the grid's batch axis (0: folded in M)
    dtype: DType                 # of A and B


def _layout(node: Node) -> str:
    return _LAYOUT.get(node.op) or node.attrs.get("weight_layout", "out_in")


def _floats(node: Node) -> bool:
    values = [v for v in [*node.inputs, *node.outputs] if v is not None]
    return all(v.dtype in TL_FLOATS for v in values) and \
        node.inputs[0].dtype == node.inputs[1].dtype


def _fits(shape: Sequence[object], target: Sequence[object]) -> bool:
    """Whether `shape` broadcasts to `target` (trailing alignment, 1 or equal per dim)."""
    if len(shape) > len(target):
        return False
    return all(equal(d, 1) or equal(d, t) for d, t in zip(reversed(shape), reversed(target)))


def _bias_fits(node: Node) -> bool:
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    return bias is None or _fits(bias.shape, node.output.shape)


# The fit check: (why the template cannot run a node, the test that says so). First match wins;
# a node that matches none is generated, one that matches runs through torch.matmul on the host.
MISFITS: tuple[tuple[str, Callable[[Node], bool]], ...] = (
    ("operands are not one float dtype (f32, f16, bf16)", lambda n: not _floats(n)),
    ("the weight is not 2-D", lambda n: n.op != "matmul" and n.inputs[1].type.rank != 2),
    ("the right operand is a vector", lambda n: n.inputs[1].type.rank < 2),
    ("a vector times a batch of matrices", lambda n: n.inputs[1].type.rank > 2
     and n.inputs[0].type.rank < 2),
    ("the bias does not broadcast to the result", lambda n: not _bias_fits(n)),
    ("an unknown activation", lambda n: n.attrs.get("activation", "none") not in ACTIVATIONS),
)


def misfit(node: Node) -> str | None:
    """Why the GEMM template cannot run `node` (None: it can)."""
    if node.op not in MATMUL_OPS:
        return f"{node.op} is not a matmul"
    check_attrs(node)
    return next((why for why, bad in MISFITS if bad(node)), None)


def _epilogue_node(node: Node, shape: Sequence[object], constants: Mapping[str, float]) -> bool:
    """Whether `node` is a float elementwise op over exactly `shape` (operands broadcast)."""
    if node.op == "pow":  # the exponent is inlined, not loaded
        known, operands = constants.get(node.inputs[1].name) in POW_EXPONENTS, node.inputs[:1]
    else:
        known = node.op in ELEMENTWISE and node.op not in _NOT_EPILOGUE and \
            node.attrs.get("rounding_mode") is None
        operands = [v for v in node.inputs if v is not None]
    return known and len(node.outputs) == 1 and _same_shape(node.output.shape, shape) and \
        all(v.dtype in TL_FLOATS for v in [*operands, node.output]) and \
        all(_fits(v.shape, shape) for v in operands)


def _same_shape(a: Sequence[object], b: Sequence[object]) -> bool:
    return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))


def epilogue(node: Node, following: Sequence[Node], users: Mapping[Value, list[Node]],
             returned: set[int], constants: Mapping[str, float]) -> list[Node]:
    """The unit `following` (the nodes run right after `node`) when it can be fused into
    `node`'s epilogue, else []. It can when the matmul result feeds that unit only, and every
    node of it is a float elementwise op over exactly the result's shape: then its other operands
    exist already (the unit comes next) and each output element needs one accumulator element."""
    out = node.output
    consumers = users.get(out, [])
    if not following or id(out) in returned or not consumers or \
            not all(any(c is n for n in following) for c in consumers):
        return []
    if all(_epilogue_node(n, out.shape, constants) for n in following):
        return list(following)
    return []


class _MatmulSourceWriter:
    """The kernel source, line by line; `expr` maps value ids to their tile expressions."""

    def __init__(self, name: str, batch: int, extras: int, outs: int):
        self.name, self.batch, self.extras, self.outs = name, batch, extras, outs
        self.lines: list[str] = []

    def strides(self, prefix: str, last: str) -> list[str]:
        return [f"{prefix}_b{d}" for d in range(self.batch)] + [f"{prefix}_{c}" for c in last]

    def header(self) -> list[str]:
        args = ["a", "b", *(f"e{i}" for i in range(self.extras)),
                *(f"o{j}" for j in range(self.outs)), "M", "N", "K",
                *(f"nb{d}" for d in range(self.batch)), *self.strides("sa", "mk"),
                *self.strides("sb", "kn"),
                *(s for i in range(self.extras) for s in self.strides(f"se{i}", "mn")),
                *(s for j in range(self.outs) for s in self.strides(f"so{j}", "mn")),
                *(f"{c}: tl.constexpr" for c in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M",
                                                 "DOT_F32"))]
        return ["@triton.jit", f"def {self.name}({', '.join(args)}):"]

    def tiles(self) -> None:
        self.lines += [
            "pid = tl.program_id(0)",
            "num_m = tl.cdiv(M, BLOCK_M)",
            "width = GROUP_M * tl.cdiv(N, BLOCK_N)",
            "first_m = (pid // width) * GROUP_M",
            "rows = tl.minimum(num_m - first_m, GROUP_M)",
            "rm = (first_m + (pid % width) % rows) * BLOCK_M + tl.arange(0, BLOCK_M)",
            "rn = ((pid % width) // rows) * BLOCK_N + tl.arange(0, BLOCK_N)",
            "rk = tl.arange(0, BLOCK_K)",
            "mask = (rm[:, None] < M) & (rn[None, :] < N)"]
        if self.batch:
            self.lines.append("t = tl.program_id(1)")
            for d in reversed(range(self.batch)):
                self.lines.append(f"c{d} = t % nb{d}")
                if d:
                    self.lines.append(f"t = t // nb{d}")

    def base(self, pointer: str, prefix: str) -> str:
        """`pointer` moved to this program's batch entry."""
        return " + ".join([pointer, *(f"c{d} * {prefix}_b{d}" for d in range(self.batch))])

    def main_loop(self, precision: str) -> None:
        self.lines += [
            f"pa = {self.base('a', 'sa')} + rm[:, None] * sa_m + rk[None, :] * sa_k",
            f"pb = {self.base('b', 'sb')} + rk[:, None] * sb_k + rn[None, :] * sb_n",
            "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
            "for k in range(0, tl.cdiv(K, BLOCK_K)):",
            "    kk = k * BLOCK_K + rk",
            "    x = tl.load(pa, mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)",
            "    w = tl.load(pb, mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)",
            "    if DOT_F32:",  # Triton's interpreter mishandles bf16 dots; its launcher says so
            "        x = x.to(tl.float32)",
            "        w = w.to(tl.float32)",
            f"    acc = tl.dot(x, w, acc{precision})",
            "    pa += BLOCK_K * sa_k",
            "    pb += BLOCK_K * sb_k"]

    def tile(self, pointer: str, prefix: str) -> str:
        return f"{self.base(pointer, prefix)} + rm[:, None] * {prefix}_m + rn[None, :] * {prefix}_n"


def _activation(name: str, expr: str) -> str:
    spec = choice(name, ACTIVATIONS, "activation")
    return expr if spec is None else ELEMENTWISE[spec[0]]([expr], spec[1])


def _node_expr(node: Node, args: list[str], constants: Mapping[str, float]) -> str:
    if node.op == "pow":
        return POW_EXPONENTS[constants[node.inputs[1].name]].format(args[0])
    return ELEMENTWISE[node.op](args, node.attrs)


def generate_matmul(name: str, node: Node, chain: Sequence[Node], outputs: Sequence[Value],
                    constants: Mapping[str, float]) -> MatmulKernel:
    """The GEMM kernel for `node` (which must pass `misfit`) with `chain` as its epilogue,
    storing `outputs` (the node's result when the chain is empty)."""
    for member in [node, *chain]:
        check_attrs(member)
    a, b = node.inputs[:2]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    result = node.output
    batch = result.type.rank - 2 if b.type.rank > 2 else 0
    inside = {id(v) for n in chain for v in n.outputs}
    extras: dict[int, Value] = {} if bias is None else {id(bias): bias}
    for member in chain:
        operands = member.inputs[:1] if member.op == "pow" else member.inputs
        for v in operands:
            if v is not None and v is not result and id(v) not in inside:
                extras.setdefault(id(v), v)
    writer = _MatmulSourceWriter(name, batch, len(extras), len(outputs))
    writer.tiles()
    writer.main_loop(', input_precision="ieee"' if a.dtype == DType.f32 else "")
    expr = {id(v): f"x{i}" for i, v in enumerate(extras.values())}
    for i in range(len(extras)):
        writer.lines.append(f"x{i} = tl.load({writer.tile(f'e{i}', f'se{i}')}, mask=mask, "
                            "other=0).to(tl.float32)")
    value = "acc" if bias is None else f"(acc + {expr[id(bias)]})"
    writer.lines.append(f"v = {_activation(node.attrs.get('activation', 'none'), value)}")
    expr[id(result)] = "v"
    for k, member in enumerate(chain):
        args = [expr.get(id(v), "") if v is not None else "" for v in member.inputs]
        writer.lines.append(f"v{k} = {_node_expr(member, args, constants)}")
        expr[id(member.output)] = f"v{k}"
    for j, out in enumerate(outputs):
        if id(out) not in expr:
            raise NotOneKernel(f"%{out.name} is not computed by the kernel")
        writer.lines.append(f"tl.store({writer.tile(f'o{j}', f'so{j}')}, "
                            f"({expr[id(out)]}).to({TL_FLOATS[out.dtype]}), mask=mask)")
    source = "\n".join([*writer.header(), *("    " + line for line in writer.lines)]) + "\n"
    shape = tuple(d if isinstance(d, int) else sympy.sympify(d) for d in result.shape)
    return MatmulKernel(name, source, tuple(n.outputs[0].name for n in [node, *chain]),
                        (a.name, b.name, *(v.name for v in extras.values())),
                        tuple(v.name for v in outputs), shape, _layout(node) == "out_in",
                        batch, a.dtype)


@dataclass(frozen=True)
class Launch:
    """The arguments of one launch, before the block sizes are chosen."""

    args: tuple[Any, ...]
    m: int
    n: int
    k: int
    batches: int
    dot_f32: bool

    @property
    def sizes(self) -> tuple[int, int, int, int]:
        return self.m, self.n, self.k, self.batches

    @property
    def empty(self) -> bool:
        return not (self.m and self.n and self.batches)


def prepare(kernel: MatmulKernel, ins: Sequence[Any], outs: Sequence[Any],
            interpreted: bool) -> Launch:
    """Launch arguments for `kernel` on torch tensors `ins` (in kernel.inputs order) writing
    `outs` (each of the result's shape). Only views are taken, except where torch cannot fold a
    strided operand's leading dims into M without a copy."""
    a, b, *extras = ins
    shape = tuple(outs[0].shape)
    n, k = shape[-1], a.shape[-1]
    b = b.t() if kernel.transposed else b
    if kernel.batch:
        lead = shape[:-2]
        m = shape[-2]
        a, b = a.expand(*lead, m, k), b.expand(*lead, k, n)
        extras = [e.expand(shape) for e in extras]
        outs = list(outs)
    else:
        lead, m = (), 1
        for d in shape[:-1]:
            m *= d
        a = a.reshape(m, k)
        extras = [e.expand(shape).reshape(m, n) for e in extras]
        outs = [o.view(m, n) for o in outs]
    batches = 1
    for d in lead:
        batches *= d
    strides = [s for t in (a, b, *extras, *outs) for s in t.stride()]
    args = (a, b, *extras, *outs, m, n, k, *lead, *strides)
    return Launch(args, m, n, k, batches, interpreted and kernel.dtype == DType.bf16)


def launch(fn: Any, prepared: Launch, config: Any) -> None:
    """Run the kernel `fn` with block sizes, warps and stages from `config`."""
    if prepared.empty:
        return
    grid = (-(-prepared.m // config.block_m) * -(-prepared.n // config.block_n),
            prepared.batches)
    fn[grid](*prepared.args, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
             BLOCK_K=config.block_k, GROUP_M=GROUP_M, DOT_F32=prepared.dot_f32,
             num_warps=config.num_warps, num_stages=config.num_stages)
