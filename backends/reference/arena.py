"""Running a graph in one arena: the memory plan used for real.

A run allocates one uint8 tensor of the plan's `arena_bytes` and every intermediate lives at its
planned offset: a node's result is computed by the op's reference semantics and copied into its
slot (a typed view of the arena), and later nodes read it from there. Values that share a buffer
are not copied: a view is whatever the view op returns on its operand's slot, checked to lie
inside the buffer it was planned in; an in-place result is copied over the buffer of the operand
it replaces. Graph outputs are copied out of the arena as soon as they are produced (the caller
keeps them after the arena is gone); views of inputs and weights stay views of those.

The per-op result before the copy is transient (like a kernel's workspace, freed before the next
node runs); no intermediate is held outside the arena, which `ArenaStats.outside` records.

The plan is read from its JSON form (`memory_plan` in the manifest; the schema is written by
passes/memory/plan.py). This module reads only what it needs, without importing the passes:
the runtime must not depend on them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from compiler.errors import ArtifactError, InputError
from compiler.ir import Graph, Value

from .interpreter import bind_inputs, run_node

PLAN_FORMAT_VERSION = 1


@dataclass(frozen=True)
class ArenaLayout:
    """Where each node output goes: its own slot, another value's buffer, or outside the arena."""

    arena_bytes: int
    alignment: int
    sizes: Mapping[str, int]                 # symbol values the slots were sized for
    slots: Mapping[str, tuple[int, int]]     # value -> (offset, reserved bytes)
    shares: Mapping[str, tuple[str, str]]    # value -> (root value, "view" | "inplace")
    external: frozenset[str]

    @classmethod
    def from_plan(cls, plan: Mapping[str, Any], where: str = "memory_plan") -> ArenaLayout:
        """Read a memory plan's JSON form; anything malformed is an ArtifactError."""
        try:
            if plan["format_version"] != PLAN_FORMAT_VERSION:
                raise ArtifactError(f"memory plan format version {plan['format_version']!r} is "
                                    f"not supported (this backend reads {PLAN_FORMAT_VERSION})",
                                    where, "recompile the model with this dayzero")
            layout = cls(int(plan["arena_bytes"]), int(plan["alignment"]),
                         {str(k): int(v) for k, v in plan["sizes"].items()},
                         {b["value"]: (int(b["offset"]), int(b["size"])) for b in plan["buffers"]},
                         {a["value"]: (a["root"], a["kind"]) for a in plan["aliases"]},
                         frozenset(plan["external"]))
        except ArtifactError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ArtifactError(f"the memory plan is malformed ({type(exc).__name__}: {exc})",
                                where, "recompile the model") from None
        layout._check_slots(where)
        return layout

    def _check_slots(self, where: str) -> None:
        if self.alignment < 1:
            raise ArtifactError(f"memory plan alignment is {self.alignment}", where,
                                "recompile the model")
        for name, (offset, size) in self.slots.items():
            if offset < 0 or size < 0 or offset + size > self.arena_bytes \
                    or offset % self.alignment:
                raise ArtifactError(f"memory plan slot of %{name} (offset {offset}, {size} "
                                    f"bytes) does not fit the {self.arena_bytes}-byte arena",
                                    where, "recompile the model")
        for name, (root, kind) in self.shares.items():
            if root not in self.slots or kind not in ("view", "inplace"):
                raise ArtifactError(f"memory plan shares %{name} with %{root} as {kind!r}, "
                                    "which has no slot", where, "recompile the model")

    def check_graph(self, graph: Graph, where: str) -> None:
        """Every node output is placed exactly once: a plan for another graph is refused."""
        outputs = [v.name for n in graph.nodes for v in n.outputs]
        kinds = (self.slots, self.shares, self.external)
        for name in outputs:
            if sum(name in k for k in kinds) != 1:
                raise ArtifactError(f"the memory plan does not place %{name} of graph.dzir "
                                    "exactly once", where, "recompile the model")
        if sum(len(k) for k in kinds) != len(outputs):
            raise ArtifactError("the memory plan places values graph.dzir does not have", where,
                                "recompile the model")


@dataclass
class ArenaStats:
    """What a run really used: the one allocation and how high intermediates reached in it."""

    arena_bytes: int = 0       # bytes of the arena allocated for this run
    high_water: int = 0        # highest reserved byte written (offset + aligned size)
    stored: int = 0            # results copied into slots of their own
    shared: int = 0            # views and in-place results placed in another value's buffer
    outside: list[str] = field(default_factory=list)  # intermediates found outside the arena


def run_in_arena(graph: Graph, weights: Mapping[str, Any], inputs: Sequence[Any],
                 layout: ArenaLayout) -> tuple[list[torch.Tensor], ArenaStats]:
    """Evaluate `graph` with every intermediate at its planned place in one arena."""
    inputs = [torch.as_tensor(x).contiguous() for x in inputs]
    env, bindings = bind_inputs(graph, weights, inputs)
    run = _Run(graph, layout, bindings, env)
    for node in graph.nodes:
        for value, tensor in zip(node.outputs, run_node(node, env, bindings)):
            env[id(value)] = run.place(value, tensor)
    return [env[id(v)] for v in graph.outputs], run.stats


class _Run:
    def __init__(self, graph: Graph, layout: ArenaLayout, bindings: Mapping[str, int],
                 env: Mapping[int, torch.Tensor]):
        self.layout, self.bindings = layout, bindings
        self.arena = torch.empty(layout.arena_bytes, dtype=torch.uint8)
        self.base = self.arena.data_ptr()
        self.stats = ArenaStats(arena_bytes=self.arena.untyped_storage().nbytes())
        self.outputs = {id(v) for v in graph.outputs}
        self.sources = {_storage(t) for t in env.values()}  # inputs and weights

    def place(self, value: Value, tensor: torch.Tensor) -> torch.Tensor:
        name = value.name
        if name in self.layout.slots:
            self.stats.stored += 1
            return self._store(name, name, tensor)
        if name in self.layout.shares:
            root, kind = self.layout.shares[name]
            self.stats.shared += 1
            if kind == "inplace":
                return self._store(name, root, tensor)
            self._check_view(name, root, tensor)
            return tensor
        if id(value) in self.outputs:
            if _storage(tensor) == _storage(self.arena):
                tensor = tensor.clone()
            self.sources.add(_storage(tensor))  # views of it are not allocations either
            return tensor
        if _storage(tensor) not in self.sources:  # a view of an input or weight that copied
            self.stats.outside.append(name)
        return tensor

    def _store(self, name: str, root: str, tensor: torch.Tensor) -> torch.Tensor:
        offset, capacity = self.layout.slots[root]
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes > capacity:
            raise InputError(
                f"%{name} needs {nbytes} bytes but its arena slot holds {capacity}: the inputs "
                f"are larger than the sizes the memory plan was made for "
                f"({_sizes(self.layout.sizes)}; this run has {_sizes(self.bindings)})",
                f"value %{name}", "recompile with plan_memory at larger sizes (the default "
                "plans every size symbol at its upper bound)")
        slot = self.arena[offset:offset + nbytes].view(tensor.dtype).view(tensor.shape)
        slot.copy_(tensor)
        reserved = -(-nbytes // self.layout.alignment) * self.layout.alignment
        self.stats.high_water = max(self.stats.high_water, offset + reserved)
        return slot

    def _check_view(self, name: str, root: str, tensor: torch.Tensor) -> None:
        offset, capacity = self.layout.slots[root]
        start = tensor.data_ptr() - self.base
        end = start + tensor.numel() * tensor.element_size()
        inside = _storage(tensor) == _storage(self.arena)
        if not inside or start < offset or end > offset + capacity or \
                not tensor.is_contiguous():
            where = f"bytes {start}..{end} of the arena" if inside else "other memory"
            raise RuntimeError(f"internal error: view %{name} was planned inside the buffer of "
                               f"%{root} (bytes {offset}..{offset + capacity}) but the op put it "
                               f"at {where}")


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _sizes(values: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(values.items())) or "static shapes"
