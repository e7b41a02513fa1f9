"""The device mesh: ranks arranged as data x pipeline x tensor (or expert) parallel coordinates.

Ranks are numbered with the pipeline axis outermost and the tensor axis innermost
(rank = (pp * dp_size + dp) * tp_size + tp), so the ranks of one tensor-parallel group are
neighbours (on one machine, where the all-reduces are) and each pipeline stage is a contiguous
block of ranks, which is what torchrun's `--nproc-per-node` hands out per machine.

Expert parallelism (`ep`) shares the innermost block with tensor parallelism: the same N
neighbouring ranks split attention by heads and a mixture of experts by experts, so with both
above one they must be equal; alone, `ep` makes that block by itself (the rest of the model then
runs replicated on its ranks). The innermost coordinate is the rank's `tp` and `ep` coordinate
alike; a coordinate whose axis has size one is 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from compiler.errors import DayzeroError

AXES = ("dp", "pp", "tp", "ep")  # mesh axes; rank order: pp, dp, then tp and ep (one block)
CONFIG_KEYS = {"dp": "parallel.data_parallel", "pp": "parallel.pipeline_parallel",
               "tp": "parallel.tensor_parallel", "ep": "parallel.expert_parallel"}
DATA_AXES = ("dp", "tp", "ep")  # axes that split or sum tensors; pp splits the graph instead
INNER = ("tp", "ep")  # the axes of the innermost block of ranks


@dataclass(frozen=True)
class Mesh:
    dp: int = 1
    pp: int = 1
    tp: int = 1
    ep: int = 1

    def __post_init__(self):
        for axis in AXES:
            size = getattr(self, axis)
            if not isinstance(size, int) or size < 1:
                raise DayzeroError(f"config key '{CONFIG_KEYS[axis]}' must be a positive "
                                   f"integer, got {size!r}", CONFIG_KEYS[axis])
        if self.tp > 1 and self.ep > 1 and self.tp != self.ep:
            raise DayzeroError(
                f"config key '{CONFIG_KEYS['ep']}' = {self.ep} differs from "
                f"'{CONFIG_KEYS['tp']}' = {self.tp}: expert and tensor parallelism split the "
                "same ranks (attention by heads, the experts by experts)", CONFIG_KEYS["ep"],
                "set both to the same size, or one of them to 1")

    @classmethod
    def from_config(cls, parallel: Mapping[str, Any]) -> Mesh:
        """From the `parallel:` config section (tensor_parallel, pipeline_parallel, ...)."""
        return cls(dp=parallel.get("data_parallel", 1), pp=parallel.get("pipeline_parallel", 1),
                   tp=parallel.get("tensor_parallel", 1), ep=parallel.get("expert_parallel", 1))

    @property
    def inner(self) -> int:
        """The size of the innermost block of ranks (tensor and expert parallel)."""
        return max(self.tp, self.ep)

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.inner

    def size(self, axis: str) -> int:
        return getattr(self, axis)

    def rank(self, dp: int = 0, pp: int = 0, tp: int = 0, ep: int = 0) -> int:
        return (pp * self.dp + dp) * self.inner + max(tp, ep)

    def coords(self, rank: int) -> dict[str, int]:
        """The rank's coordinate on every axis (`ep` only in a mesh that has that axis)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside a mesh of {self.world_size}")
        inner = rank % self.inner
        dp = (rank // self.inner) % self.dp
        pp = rank // (self.inner * self.dp)
        coords = {"dp": dp, "pp": pp, "tp": inner if self.tp > 1 else 0}
        if self.ep > 1:
            coords["ep"] = inner
        return coords

    def group(self, rank: int, axis: str) -> list[int]:
        """The ranks that share every coordinate with `rank` except `axis`, in axis order."""
        coords = self.coords(rank)
        if self.size(axis) == 1:
            return [rank]
        if axis in INNER:  # tp and ep name one coordinate: clear both, then walk `axis`
            coords = {**coords, **{a: 0 for a in INNER if a in coords}}
        return [self.rank(**{**coords, axis: i}) for i in range(self.size(axis))]

    def groups(self, axis: str) -> list[list[int]]:
        """Every group along `axis`, each once, ordered by their first rank."""
        seen: dict[int, list[int]] = {}
        for rank in range(self.world_size):
            group = self.group(rank, axis)
            seen.setdefault(group[0], group)
        return [seen[k] for k in sorted(seen)]

    def to_dict(self) -> dict[str, int]:
        sizes = {"data_parallel": self.dp, "pipeline_parallel": self.pp,
                 "tensor_parallel": self.tp}
        return {**sizes, "expert_parallel": self.ep} if self.ep > 1 else sizes

    def __str__(self) -> str:
        text = f"dp={self.dp} x pp={self.pp} x tp={self.tp}"
        return f"{text} (ep={self.ep})" if self.ep > 1 else text
