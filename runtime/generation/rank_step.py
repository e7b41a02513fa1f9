"""One rank of a tensor-parallel generation artifact: its step program and the step channel.

A tensor-parallel generation artifact (`parallel: {tensor_parallel: N}` with task
text-generation) has one step program per rank: each rank holds its attention heads, its share
of the MLP and its KV heads' pool; the logits come out whole on every rank
(passes/parallel/kv_cache_shards.py). Rank 0 runs the scheduler; before every step it
broadcasts the step's parts (each sequence's tokens, start position, block table and whether
its logits come back) over torch.distributed, and every rank builds the same step inputs from
them (`build_step` is deterministic) and runs its program, so the ranks step together and the
block tables agree everywhere. `python -m runtime.generation.rank_step ARTIFACT` is a rank
other than 0, started by rank 0 (runtime/generation/ranks.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import backends
from compiler.errors import DayzeroError

from ..comm import DEFAULT_TIMEOUT, TorchCommunicator
from ..distributed import RankModel, _die_with_parent, _fail
from ..model import FixedInputsModel
from ..specs import TensorSpec, symbol_ranges
from ..validate import prepare_inputs
from .engine import StepRunner
from .spec import GenerationSpec
from .step import StepPart, build_step

WORKER = "runtime.generation.rank_step"
STOP, STEP, FORWARD = 0, 1, 2  # what rank 0 asks of the others
_PART = 4  # int64 entries per part in a step message: tokens, start, table length, logits


class RankStepModel:
    """This rank's step program, called like a CompiledModel with this rank's inputs (its
    share of the pool) and returning this rank's outputs: the whole logits, its KV heads' new
    keys and values."""

    def __init__(self, rank_model: RankModel):
        self.rank_model = rank_model
        self.artifact = rank_model.artifact
        self.comm: TorchCommunicator = rank_model.comm
        graph = rank_model.program.graph
        ranges = symbol_ranges(self.artifact.manifest)
        self.input_specs = [_spec(v, ranges) for v in graph.inputs]
        self.output_specs = [_spec(v, ranges) for v in graph.outputs]
        self.index_ranges = rank_model.index_ranges
        self.backend = backends.get(self.artifact.backend)

    @property
    def path(self) -> Path:
        return self.artifact.root

    @property
    def manifest(self) -> dict[str, Any]:
        return self.artifact.manifest

    @property
    def rank(self) -> int:
        return self.comm.env.rank

    def __call__(self, *inputs: Any) -> tuple[np.ndarray, ...]:
        arrays, bindings = prepare_inputs(self.input_specs, inputs, self.index_ranges)
        return self._run(arrays, bindings)

    def with_fixed_inputs(self, fixed: Mapping[str, Any]) -> FixedInputsModel:
        """As `CompiledModel.with_fixed_inputs`: this rank's pools validated once."""
        return FixedInputsModel(self, fixed)

    def _run(self, arrays: list[np.ndarray], bindings: dict[str, int]) -> tuple[np.ndarray, ...]:
        from compiler.ir.ops.collective import bind_communicator

        try:
            with bind_communicator(self.comm):
                return tuple(self.rank_model.program(arrays, bindings))
        except BaseException as exc:
            self.comm.watchdog.fail(_describe(exc))
            raise


def _spec(value, ranges) -> TensorSpec:
    shape = tuple(d if isinstance(d, int) else str(d) for d in value.type.shape)
    used = {s: r for s, r in ranges.items() if s in shape}
    return TensorSpec(value.name, value.type.dtype.value, shape, used)


def _describe(exc: BaseException) -> str:
    return exc.message() if isinstance(exc, DayzeroError) else f"{type(exc).__name__}: {exc}"


def rank_spec(spec: GenerationSpec, ranks: int, kv_cache_memory: int | None) -> GenerationSpec:
    """The spec of one rank's share: its KV heads, and the memory that holds exactly as many
    blocks as the whole cache would (every rank's pool has the same blocks, so one block table
    serves them all)."""
    where = "generation.layers (parallel.tensor_parallel)"
    if any(c.kv_heads % ranks for c in spec.layers):
        raise DayzeroError(f"the KV heads {[c.kv_heads for c in spec.layers]} do not divide "
                           f"over {ranks} ranks", where, "the artifact is corrupted; recompile it")
    blocks = spec.cache_layout().blocks_for(kv_cache_memory or spec.kv_cache_memory)
    layers = tuple(dataclasses.replace(c, kv_heads=c.kv_heads // ranks) for c in spec.layers)
    local = dataclasses.replace(spec, layers=layers)
    return dataclasses.replace(local, kv_cache_memory=blocks * local.cache_layout().block_bytes)


class StepChannel:
    """Rank 0's steps to the other ranks: a header, then the parts packed in one int64 array,
    each a broadcast from rank 0 on the world group."""

    def __init__(self, comm: TorchCommunicator):
        self.comm = comm

    def send(self, kind: int, parts: Sequence[StepPart] = ()) -> None:
        meta = np.asarray([[len(p.tokens), p.start, len(p.table), int(p.logits)] for p in parts],
                          np.int64).reshape(-1)
        data = np.concatenate([meta, *[np.asarray(p.tokens, np.int64) for p in parts],
                               *[np.asarray(p.table, np.int64) for p in parts]]) \
            if parts else np.zeros(0, np.int64)
        self._broadcast(np.asarray([kind, len(parts), data.size], np.int64))
        if data.size:
            self._broadcast(data)

    def receive(self) -> tuple[int, list[StepPart]]:
        kind, count, size = (int(x) for x in self._broadcast(np.zeros(3, np.int64)))
        if not size:
            return kind, []
        data = self._broadcast(np.zeros(size, np.int64))
        meta = data[:_PART * count].reshape(count, _PART)
        at = _PART * count
        tokens = []
        for n in meta[:, 0]:
            tokens.append(data[at:at + n])
            at += n
        parts = []
        for (_, start, blocks, logits), toks in zip(meta, tokens):
            parts.append(StepPart(toks, int(start), data[at:at + blocks].tolist(), bool(logits)))
            at += blocks
        return kind, parts

    def _broadcast(self, array: np.ndarray) -> np.ndarray:
        import torch
        import torch.distributed as dist

        tensor = torch.from_numpy(array)
        try:
            dist.broadcast(tensor, 0)
        except RuntimeError as exc:
            world = list(range(self.comm.env.world_size))
            raise self.comm.failure("broadcast of a generation step", world, exc) from None
        return tensor.numpy()


def forward_logits(runner: StepRunner, part: StepPart) -> np.ndarray:
    """Every position's logits of one prompt (the artifact called as its forward), as
    GenerationModel computes them: one step whose logit rows are all of its tokens."""
    step = build_step([part], runner.spec.block_size)
    step.feeds["logit_indices"] = np.arange(len(part.tokens), dtype=np.int64)
    return runner.call(step.feeds)[0].reshape(len(part.tokens), -1)


def serve_steps(runner: StepRunner, channel: StepChannel) -> None:
    """A rank other than 0: run what rank 0 sends until it says stop."""
    while True:
        kind, parts = channel.receive()
        if kind == STOP:
            return
        if kind == STEP:
            runner.run(parts)
        elif kind == FORWARD:
            forward_logits(runner, parts[0])
        else:
            raise DayzeroError(f"rank 0 sent an unknown step kind {kind}", "step channel",
                               "rank 0 and this rank run different dayzero versions?")


def main(argv: list[str] | None = None) -> int:
    """`python -m runtime.generation.rank_step ARTIFACT [--kv-cache-memory BYTES]`, with
    RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set by rank 0."""
    parser = argparse.ArgumentParser(prog=f"python -m {WORKER}",
                                     description="one rank of a tensor-parallel generation "
                                                 "artifact (started by rank 0)")
    parser.add_argument("artifact")
    parser.add_argument("--kv-cache-memory", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT)
    parser.add_argument("--verify", choices=("full", "size"), default="full")
    args = parser.parse_args(argv)
    _die_with_parent()
    rank, model = os.environ.get("RANK", "?"), None
    try:
        model = RankModel(args.artifact, verify=args.verify, timeout=args.timeout)
        step = RankStepModel(model)
        spec = GenerationSpec.from_manifest(model.artifact.manifest.get("generation"),
                                            str(model.path))
        world = model.env.world_size
        runner = StepRunner(step, rank_spec(spec, world, args.kv_cache_memory))
        serve_steps(runner, StepChannel(model.comm))
        model.close()
        return 0
    except DayzeroError as exc:
        return _fail(rank, model, exc.message())
    except Exception as exc:
        return _fail(rank, model, f"internal error: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    sys.exit(main())
