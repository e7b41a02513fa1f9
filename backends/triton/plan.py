"""Which nodes become generated kernels and which run as host ops, in execution order.

Fusion groups (nodes sharing a `fusion_group` attribute, contiguous, from the `fuse_groups`
pass) become one kernel each; a group the generator cannot express is split into one kernel per
member. Elementwise ops, reductions over trailing dims, norms and softmax outside groups get a
kernel of their own. matmul, linear and fused_linear become a tiled GEMM kernel (`matmul.py`)
with the bias and activation in its epilogue; when the unit right after one is elementwise only
and the matmul's result feeds nothing else (a residual add, `silu(gate) * up`), that unit runs in
the same kernel's epilogue instead of as a kernel of its own. A matmul the template does not fit
(`matmul.misfit`: integer dtypes, matrix-vector products, ...) runs through torch.matmul on the
host. Everything else the backend supports runs as a host op: views and data movement
(zero-copy where torch allows), embedding and indexing through torch, attention through the
Triton attention kernel (`attention.py`). The plan is a pure function of the graph, so the same
kernels are regenerated at load time as at compile time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from compiler.ir import Graph, Node, Value

from .codegen import Kernel, NotOneKernel, generate, generate_permuted
from .emit import ELEMENTWISE, ROW_OPS
from .matmul import MATMUL_OPS, MatmulKernel, epilogue, generate_matmul, misfit
from .source_guard import HEADER, kernel_name

KERNEL_OPS = frozenset(ELEMENTWISE) | {"pow"} | frozenset(ROW_OPS)
MODULE_HEADER = "".join(f"{line}\n" for line in HEADER)


@dataclass(frozen=True)
class LaunchStep:
    """One thing the executable does: launch `kernel` (an elementwise/row `Kernel` or a GEMM
    `MatmulKernel`), run `node` on the host, or run fallback segment number `segment` on the
    fallback backend. `kind` names which, so the executable dispatches through a table."""

    kernel: Kernel | MatmulKernel | None = None
    node: Node | None = None
    segment: int | None = None

    @property
    def kind(self) -> str:
        if self.kernel is not None:
            return "matmul" if isinstance(self.kernel, MatmulKernel) else "kernel"
        return "host" if self.node is not None else "segment"


def constants(graph: Graph) -> dict[str, float]:
    """Numbers of 0-d constant nodes (kernels inline pow exponents from them)."""
    out = {}
    for node in graph.nodes:
        if node.op == "constant" and node.output.type.rank == 0:
            value = node.attrs["value"]
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[node.output.name] = float(value)
    return out


def _units(graph: Graph) -> list[list[Node]]:
    units: list[list[Node]] = []
    last = None
    for node in graph.nodes:
        group = node.attrs.get("fusion_group")
        if group is not None and group == last:
            units[-1].append(node)
        else:
            units.append([node])
        last = group
    return units


class _LaunchPlanner:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.users = graph.users()
        self.returned = {id(v) for v in graph.outputs}
        self.constants = constants(graph)
        self.steps: list[LaunchStep] = []

    def unit(self, nodes: list[Node], following: list[Node]) -> bool:
        """Plan one unit; `following` is the next unit, which a matmul may take into its
        epilogue. Returns whether it did (the caller then skips that unit)."""
        if len(nodes) == 1 and nodes[0].op in MATMUL_OPS:
            return self._matmul(nodes[0], following)
        produced = {id(v) for n in nodes for v in n.outputs}
        pre = [n for n in nodes if n.op == "reshape" and id(n.inputs[0]) not in produced]
        body = [n for n in nodes if n not in pre]
        self.steps += [LaunchStep(node=n) for n in pre]
        if len(body) > 1 and self._kernel(body):
            return False
        for node in body:
            if node.op in MATMUL_OPS:
                self._matmul(node, [])
            elif node.op not in KERNEL_OPS or not self._kernel([node]):
                self.steps.append(LaunchStep(node=node))
        return False

    def _name(self, node: Node) -> str:
        return kernel_name(len([s for s in self.steps if s.kernel]), node.op)

    def _matmul(self, node: Node, following: list[Node]) -> bool:
        """A GEMM kernel for `node`, with `following` as its epilogue when it qualifies; a host
        op when the template does not fit."""
        if misfit(node) is not None:
            self.steps.append(LaunchStep(node=node))
            return False
        chain = epilogue(node, following, self.users, self.returned, self.constants)
        inside = {id(n) for n in chain}
        outputs = [v for n in chain for v in n.outputs if id(v) in self.returned
                   or any(id(u) not in inside for u in self.users.get(v, []))]
        try:
            kernel = generate_matmul(self._name(node), node, chain, outputs or [node.output],
                                     self.constants)
        except NotOneKernel:
            chain = []
            kernel = generate_matmul(self._name(node), node, [], [node.output], self.constants)
        self.steps.append(LaunchStep(kernel=kernel))
        return bool(chain)

    def _kernel(self, nodes: list[Node]) -> bool:
        inside = {id(n) for n in nodes}
        produced = {id(v) for n in nodes for v in n.outputs}
        inputs: dict[int, Value] = {}
        for node in nodes:
            for v in node.inputs:
                if v is not None and id(v) not in produced and not _inlined(node, v, self):
                    inputs.setdefault(id(v), v)
        outputs = [v for n in nodes for v in n.outputs if id(v) in self.returned
                   or any(id(u) not in inside for u in self.users.get(v, []))]
        name = self._name(nodes[0])
        try:
            kernel = generate(name, nodes, list(inputs.values()), outputs, self.constants)
        except NotOneKernel:
            if len(nodes) > 1 or len(outputs) != 1:
                return False
            try:
                kernel = generate_permuted(name, nodes[0])
            except NotOneKernel:
                return False
        self.steps.append(LaunchStep(kernel=kernel))
        return True


def _inlined(node: Node, value: Value, planner: _LaunchPlanner) -> bool:
    """pow's constant exponent is written into the kernel, not loaded."""
    return node.op == "pow" and value is node.inputs[1] and value.name in planner.constants


def plan(graph: Graph, foreign: Mapping[str, int] | None = None) -> list[LaunchStep]:
    """The executable's steps for `graph` (deterministic: same graph, same kernels).

    `foreign` maps nodes (by first output name) tagged for the fallback to their segment."""
    foreign = foreign or {}
    planner = _LaunchPlanner(graph)
    units = _units(graph)
    local = [not any(n.outputs[0].name in foreign for n in nodes) for nodes in units]
    taken = False  # the previous unit's matmul took this unit into its epilogue
    for i, nodes in enumerate(units):
        if taken:
            taken = False
        elif local[i]:
            following = units[i + 1] if i + 1 < len(units) and local[i + 1] else []
            taken = planner.unit(nodes, following)
        else:
            for node in nodes:
                segment = foreign.get(node.outputs[0].name)
                if segment is None:
                    planner.unit([node], [])
                elif not planner.steps or planner.steps[-1].segment != segment:
                    planner.steps.append(LaunchStep(segment=segment))
    return planner.steps


def module_source(steps: list[LaunchStep]) -> str:
    """The Python module holding every kernel of a plan."""
    return MODULE_HEADER + "".join(f"\n\n{s.kernel.source}" for s in steps if s.kernel)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
