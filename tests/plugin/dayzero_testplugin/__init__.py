"""An example dayzero backend plugin: a handful of ops executed with numpy.

It shows the whole plugin contract in one file (docs/backends.md walks through it):
capabilities as data, `lower` turning the graph into a payload file (here a JSON program, data
only), and `load` rebuilding an executable from that payload and the artifact's weights without
executing anything stored in the artifact. It needs numpy only: no torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from backends import ArtifactView, Backend, Capabilities, WeightLocation
from compiler.errors import DayzeroError

# op name -> numpy implementation; the keys are this backend's capabilities
KERNELS = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "neg": np.negative,
    "exp": np.exp,
    "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, np.zeros((), x.dtype)),
    "matmul": np.matmul,
    "linear": lambda x, w, b=None: x @ w.T if b is None else x @ w.T + b,
}

PROGRAM = "program.json"


class NumpyBackend(Backend):
    name = "testplugin"

    def capabilities(self) -> Capabilities:
        return Capabilities(ops=frozenset(KERNELS), dtypes=frozenset({"f32", "f64"}),
                            symbolic_shapes=True, notes={"linear": "bias optional"})

    def lower(self, graph, weights: Mapping[str, WeightLocation],
              options: Mapping[str, Any]) -> dict[str, bytes]:
        """A JSON program: value names in, one step per node, value names out."""
        steps = []
        for node in graph.nodes:
            if not self.supports(node):
                raise DayzeroError(f"testplugin cannot run {node.op}", f"node {node}",
                                   "use the reference backend")
            steps.append({"op": node.op, "inputs": [_ref(graph, v) for v in node.inputs],
                          "output": _ref(graph, node.output)})
        program = {"inputs": [_ref(graph, v) for v in graph.inputs], "steps": steps,
                   "outputs": [_ref(graph, v) for v in graph.outputs],
                   "scale": float(options.get("scale", 1.0))}
        return {PROGRAM: json.dumps(program, indent=1).encode()}

    def load(self, artifact: ArtifactView):
        program = json.loads(artifact.payload_path(PROGRAM).read_text())
        unknown = {s["op"] for s in program["steps"]} - set(KERNELS)
        if unknown:
            raise DayzeroError(f"program.json uses ops {sorted(unknown)} testplugin does not have",
                               str(artifact.root), "recompile the artifact")
        return _Program(program, artifact.weights("np"))


def _ref(graph, value) -> str | None:
    """Weights (@name) and values (%name) are separate namespaces in the IR, so also here."""
    if value is None:
        return None
    return ("@" if graph.is_weight(value) else "%") + value.name


class _Program:
    def __init__(self, program: dict[str, Any], weights: Mapping[str, np.ndarray]):
        self.program = program
        self.weights = weights

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        env: dict[str, Any] = {"@" + name: w for name, w in self.weights.items()}
        env.update(zip(self.program["inputs"], inputs))
        for step in self.program["steps"]:
            args = [env[name] if name is not None else None for name in step["inputs"]]
            while args and args[-1] is None:
                args.pop()
            env[step["output"]] = KERNELS[step["op"]](*args)
        scale = self.program["scale"]
        outs = [np.asarray(env[name]) for name in self.program["outputs"]]
        return outs if scale == 1.0 else [(o * scale).astype(o.dtype) for o in outs]
