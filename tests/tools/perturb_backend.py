"""A test backend that runs the reference interpreter but deliberately gets one op wrong.

`perturbing(op, occurrence, relative)` makes a Backend class whose executable adds
`relative * max|x|` to every element of the output of the `occurrence`-th node of `op`
(execution order) and computes everything after it from that wrong value, like a backend with
one buggy kernel. It implements `Backend.observe`, so `dayzero align` sees every intermediate,
and must name exactly that node as the first divergence. Register it in a test with
`backends.register("perturb", perturbing("softmax"))`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from backends import ArtifactView, Backend, Capabilities, WeightLocation
from compiler.ir import OPS, DType, Graph, parse_ir


def perturbing(op: str, occurrence: int = 0, relative: float = 1e-2) -> type[Backend]:
    """A Backend class that perturbs the `occurrence`-th `op` node by `relative`."""

    class PerturbBackend(_Perturb):
        target = (op, occurrence, relative)

    return PerturbBackend


class _Perturb(Backend):
    name = "perturb"
    target: tuple[str, int, float] = ("softmax", 0, 1e-2)

    def capabilities(self) -> Capabilities:
        return Capabilities(ops=frozenset(OPS), dtypes=frozenset(d.value for d in DType))

    def lower(self, graph: Graph, weights: Mapping[str, WeightLocation],
              options: Mapping[str, Any]) -> dict[str, bytes]:
        return {}

    def load(self, artifact: ArtifactView):
        run = self.observe(artifact, [])
        return lambda inputs: run(inputs)[0]

    def observe(self, artifact: ArtifactView, values: Sequence[str]):
        graph = parse_ir(artifact.graph_text())
        weights = artifact.weights("torch")
        op, occurrence, relative = self.target
        nodes = [n for n in graph.nodes if n.op == op]
        victim = nodes[occurrence] if occurrence < len(nodes) else None
        wanted = set(values)

        def run(inputs):
            from backends.reference.interpreter import bind_inputs, run_node

            env, bindings = bind_inputs(graph, weights, list(inputs))
            seen = {}
            for node in graph.nodes:
                results = run_node(node, env, bindings)
                if node is victim:
                    results = tuple(r + relative * r.abs().max() for r in results)
                for value, tensor in zip(node.outputs, results):
                    env[id(value)] = tensor
                    if value.name in wanted:
                        seen[value.name] = tensor.numpy()
            return [env[id(v)].numpy() for v in graph.outputs], seen

        return run
