"""Running one rank's program: compute segments on the backend, communication in between.

Each compute segment is loaded by the artifact's backend exactly like a whole model (through a
`SegmentView` of the artifact, which shows the backend the segment's graph, this rank's weights
and the segment's payload folder), so every backend serves partitioned artifacts. Communication
ops run with their reference semantics on torch tensors, through the `Communicator` bound by the
caller (torch.distributed in `runtime.distributed`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import backends
from compiler.ir import DType, Graph, get_op, print_ir, symbolic

from .artifact import Artifact
from .comm import RankFailure
from .graph_checks import parse_verified
from .rank_files import segment_payload_dir
from .segments import RankStep, split_steps
from .to_numpy import to_numpy


class SegmentView:
    """What a backend's `load` sees of one compute segment of one rank (an ArtifactView)."""

    def __init__(self, artifact: Artifact, rank: int, segment: int, graph: Graph):
        self.artifact, self.rank, self.segment = artifact, rank, segment
        self.root: Path = artifact.root
        # whole-model facts (a memory plan, say) do not describe a segment: the backend gets none
        self.manifest = {k: v for k, v in artifact.manifest.items() if k != "memory_plan"}
        self._text = print_ir(graph)

    def graph_text(self) -> str:
        return self._text

    def weights(self, framework: str = "np") -> dict[str, Any]:
        return self.artifact.weights(framework, rank=self.rank)

    def weight_locations(self):
        return self.artifact.weight_locations(rank=self.rank)

    def payload_path(self, relpath: str) -> Path:
        return self.artifact.payload_path(f"{segment_payload_dir(self.rank, self.segment)}/"
                                          f"{relpath}")


class RankExecutor:
    """One rank's program, loaded: call it with the model inputs (numpy), get its outputs.

    Ranks of other than the last pipeline stage return no outputs.
    """

    def __init__(self, artifact: Artifact, rank: int):
        self.rank = rank
        self.graph = parse_verified(artifact.graph_text(rank),
                                    f"{artifact.root}/graphs/rank-{rank}.dzir")
        backend = backends.get(artifact.backend)
        self.steps: list[RankStep] = split_steps(self.graph)
        self.loaded: dict[int, Any] = {}
        segment = 0
        for index, step in enumerate(self.steps):
            if step.is_compute:
                view = SegmentView(artifact, rank, segment, step.graph)
                self.loaded[index] = backend.load(view)
                segment += 1

    def __call__(self, inputs: Sequence[np.ndarray], bindings: dict[str, int]) -> list:
        env: dict[int, Any] = {id(v): x for v, x in zip(self.graph.inputs, inputs)}
        for index, step in enumerate(self.steps):
            if step.is_compute:
                args = list(inputs) + [to_numpy(env[id(v)]) for v in step.reads]
                results = self.loaded[index](args)
                env.update({id(v): r for v, r in zip(step.writes, results)})
            else:
                node = step.node
                results = _communicate(node, env, bindings)
                if len(node.outputs) == 1:  # expert_dispatch returns three tensors
                    results = (results,)
                env.update({id(v): r for v, r in zip(node.outputs, results)})
        return [to_numpy(env[id(v)]) for v in self.graph.outputs]


def _communicate(node, env: dict[int, Any], bindings: dict[str, int]):
    args = [to_torch(env[id(v)]) for v in node.inputs]
    attrs = {k: symbolic.resolve(v, bindings) for k, v in node.attrs.items()}
    try:
        return get_op(node.op).reference(*args, **attrs)
    except RankFailure as exc:  # say which node of the program was waiting
        where = f"{node.op} %{node.outputs[0].name}" + (f" from {node.loc}" if node.loc else "")
        raise RankFailure(exc.what, f"{exc.where}; {where}", exc.fix, exc.ranks) from None


# dtypes numpy has no native type for -> the numpy integer type of the same width (moved as bits)
_RAW_BITS = {DType.bf16: np.int16, DType.f8e4m3: np.uint8, DType.f8e5m2: np.uint8}


def to_torch(x: Any):
    """A torch tensor for a numpy array or tensor (bf16 and fp8 arrays moved as raw bits)."""
    import torch

    if not isinstance(x, np.ndarray):
        return torch.as_tensor(x)
    if not x.flags.writeable:  # torch refuses read-only memory; copy only then
        x = x.copy()
    dtype = DType.from_numpy(x.dtype)
    if dtype in _RAW_BITS:
        return torch.from_numpy(np.asarray(x, order="C").view(_RAW_BITS[dtype])).view(
            dtype.to_torch())
    return torch.from_numpy(x)


