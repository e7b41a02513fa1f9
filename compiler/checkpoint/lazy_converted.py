"""Lazy handles of parameters that transformers assembles from several checkpoint tensors.

A mixture of experts' stacked weight (`experts.gate_up_proj`, [experts, 2 * inter, hidden]) is
made from one tensor per expert and projection in the Hub's checkpoints. Stacking along a new
first dim and concatenating along the next one (transformers' `MergeModulelist(dim=0)` then
`Concatenate(dim=1)`) only puts the row-major parts one after the other: expert 0's gate, expert
0's up, expert 1's gate, ... So `LazyStack` streams the parts in that order, chunk by chunk, and
the stacked tensor is never assembled in memory; each expert's tensor is read when the writer
reaches its slice.

Any other conversion transformers declares (a transpose, an interleave, a split) is run by
transformers' own operations in `ConvertJob`, on the source tensors of that one parameter (read
whole, a parameter at a time, never the checkpoint), shared by the handles of its outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from compiler.ir import DType

from . import precision
from .lazy import CHUNK_BYTES, LazyConcat, StreamStats, _Lazy, byte_chunks


class LazyStack(LazyConcat):
    """Parts whose bytes, one after the other, are a tensor of `shape` (experts stacked)."""

    __slots__ = ("_shape",)

    def __init__(self, parts: Sequence[_Lazy], shape: tuple[int, ...]):
        super().__init__(parts)
        numel = 1
        for d in shape:
            numel *= d
        if numel != sum(p.numel() for p in self.parts):
            raise ValueError(f"{len(self.parts)} parts do not make a tensor of shape {shape}")
        self._shape = tuple(shape)

    def __repr__(self) -> str:
        return f"LazyStack({self.ir_dtype}{list(self.shape)}, {len(self.parts)} parts)"

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    def astype_lazy(self, dtype: DType) -> LazyStack:
        return LazyStack([p.astype_lazy(dtype) for p in self.parts], self._shape)


class ConvertJob:
    """Runs a transformers converter once on its source handles; keeps each output until its
    handle has taken it (an output read twice is converted again rather than kept)."""

    def __init__(self, sources: Sequence[_Lazy], run: Callable[[list[Any]], dict[str, Any]]):
        self.sources, self.run = tuple(sources), run
        self._results: dict[str, Any] = {}
        self._taken: set[str] = set()

    def take(self, name: str) -> Any:
        if name in self._taken or not self._results:
            self._results = self.run([s.load() for s in self.sources])
            self._taken = set()
        self._taken.add(name)
        return self._results.pop(name)


class LazyConverted(_Lazy):
    """One output of a `ConvertJob`, converted to `ir_dtype` when read."""

    __slots__ = ("job", "name", "_shape", "ir_dtype")

    def __init__(self, job: ConvertJob, name: str, shape: tuple[int, ...], ir_dtype: DType):
        self.job, self.name, self._shape, self.ir_dtype = job, name, tuple(shape), ir_dtype

    def __repr__(self) -> str:
        return (f"LazyConverted({self.name}: {self.ir_dtype}{list(self.shape)}, from "
                f"{len(self.job.sources)} checkpoint tensors)")

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def _stats(self) -> StreamStats:
        return self.job.sources[0]._stats

    def astype_lazy(self, dtype: DType) -> LazyConverted:
        return LazyConverted(self.job, self.name, self._shape, dtype)

    def iter_chunks(self, chunk_bytes: int = CHUNK_BYTES) -> Iterator[memoryview]:
        stats = self._stats
        for chunk in self._chunks(chunk_bytes):
            yield chunk
            stats.bytes_written += chunk.nbytes
        stats.tensors += 1

    def _chunks(self, chunk_bytes: int) -> Iterator[memoryview]:
        data = self.job.take(self.name)
        if tuple(data.shape) != self._shape:
            raise ValueError(f"{self.name}: transformers' conversion gave {list(data.shape)}, "
                             f"not {list(self._shape)}")
        yield from byte_chunks(precision.convert(data, self.ir_dtype, self.name), chunk_bytes)
