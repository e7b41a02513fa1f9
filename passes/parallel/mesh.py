"""The device mesh: ranks arranged as data x pipeline x tensor parallel coordinates.

Ranks are numbered with the pipeline axis outermost and the tensor axis innermost
(rank = (pp * dp_size + dp) * tp_size + tp), so the ranks of one tensor-parallel group are
neighbours (on one machine, where the all-reduces are) and each pipeline stage is a contiguous
block of ranks, which is what torchrun's `--nproc-per-node` hands out per machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from compiler.errors import DayzeroError

AXES = ("dp", "pp", "tp")  # mesh axes, outermost last in rank order: pp, dp, tp
CONFIG_KEYS = {"dp": "parallel.data_parallel", "pp": "parallel.pipeline_parallel",
               "tp": "parallel.tensor_parallel"}
DATA_AXES = ("dp", "tp")  # axes that split or sum tensors; pp splits the graph instead


@dataclass(frozen=True)
class Mesh:
    dp: int = 1
    pp: int = 1
    tp: int = 1

    def __post_init__(self):
        for axis in AXES:
            size = getattr(self, axis)
            if not isinstance(size, int) or size < 1:
                raise DayzeroError(f"config key '{CONFIG_KEYS[axis]}' must be a positive "
                                   f"integer, got {size!r}", CONFIG_KEYS[axis])

    @classmethod
    def from_config(cls, parallel: Mapping[str, Any]) -> Mesh:
        """From the `parallel:` config section (tensor_parallel, pipeline_parallel, ...)."""
        return cls(dp=parallel.get("data_parallel", 1), pp=parallel.get("pipeline_parallel", 1),
                   tp=parallel.get("tensor_parallel", 1))

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    def size(self, axis: str) -> int:
        return getattr(self, axis)

    def rank(self, dp: int = 0, pp: int = 0, tp: int = 0) -> int:
        return (pp * self.dp + dp) * self.tp + tp

    def coords(self, rank: int) -> dict[str, int]:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside a mesh of {self.world_size}")
        tp = rank % self.tp
        dp = (rank // self.tp) % self.dp
        pp = rank // (self.tp * self.dp)
        return {"dp": dp, "pp": pp, "tp": tp}

    def group(self, rank: int, axis: str) -> list[int]:
        """The ranks that share every coordinate with `rank` except `axis`, in axis order."""
        coords = self.coords(rank)
        return [self.rank(**{**coords, axis: i}) for i in range(self.size(axis))]

    def groups(self, axis: str) -> list[list[int]]:
        """Every group along `axis`, each once, ordered by their first rank."""
        seen: dict[int, list[int]] = {}
        for rank in range(self.world_size):
            group = self.group(rank, axis)
            seen.setdefault(group[0], group)
        return [seen[k] for k in sorted(seen)]

    def to_dict(self) -> dict[str, int]:
        return {"data_parallel": self.dp, "pipeline_parallel": self.pp,
                "tensor_parallel": self.tp}

    def __str__(self) -> str:
        return f"dp={self.dp} x pp={self.pp} x tp={self.tp}"
