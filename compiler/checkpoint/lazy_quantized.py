"""Quantized codes and scales of a streamed checkpoint weight, computed when first written.

A checkpoint bigger than memory is streamed into the artifact tensor by tensor; quantizing it
must not hold every weight at once. Each quantized linear weight becomes two handles (codes,
scales) sharing one job: the first one the writer streams reads the source weight whole (one
tensor in memory at a time), quantizes it, and keeps both results, a ninth of the source's
bytes at 4 bits, until the other handle has been streamed too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from compiler.ir import DType

from .lazy import CHUNK_BYTES, StreamStats, _Lazy, byte_chunks

Quantizer = Callable[[Any, int, int], tuple[Any, Any]]


class QuantizeJob:
    """Quantizes `source` once, for its two handles; forgets the results once both took theirs."""

    def __init__(self, source: _Lazy, bits: int, group_size: int, quantize: Quantizer,
                 shapes: tuple | None = None, scale_dtype: DType | None = None):
        self.source, self.bits, self.group_size, self.quantize = source, bits, group_size, quantize
        self.scale_dtype = scale_dtype or source.ir_dtype
        if shapes is None:  # quantize_weights' rule on a [N, K] weight
            n, k = source.shape
            shapes = ((n, k // group_size, group_size * bits // 8), (n * (k // group_size),))
        self.shapes = {"codes": tuple(shapes[0]), "scales": tuple(shapes[1])}
        self._results: dict[str, Any] = {}

    def handles(self) -> tuple[LazyQuantized, LazyQuantized]:
        return LazyQuantized(self, "codes"), LazyQuantized(self, "scales")

    def take(self, part: str) -> Any:
        if not self._results:
            codes, scales = self.quantize(self.source.load(), self.bits, self.group_size)
            self._results = {"codes": codes, "scales": scales}
        return self._results.pop(part) if part in self._results else self._again(part)

    def _again(self, part: str) -> Any:
        """A handle read twice (a pass and the writer, say): quantize again rather than keep."""
        codes, scales = self.quantize(self.source.load(), self.bits, self.group_size)
        return codes if part == "codes" else scales


class LazyQuantized(_Lazy):
    """The codes (u8) or the scales (the job's scale dtype) of a quantized lazy weight."""

    __slots__ = ("job", "part")

    def __init__(self, job: QuantizeJob, part: str):
        self.job, self.part = job, part

    def __repr__(self) -> str:
        return (f"LazyQuantized({self.part} of {self.job.source!r}, int{self.job.bits}, "
                f"group {self.job.group_size})")

    @property
    def shape(self) -> tuple[int, ...]:
        return self.job.shapes[self.part]

    @property
    def ir_dtype(self) -> DType:
        return DType.u8 if self.part == "codes" else self.job.scale_dtype

    @property
    def _stats(self) -> StreamStats:
        return self.job.source._stats

    def iter_chunks(self, chunk_bytes: int = CHUNK_BYTES) -> Iterator[memoryview]:
        yield from self._chunks(chunk_bytes)
        self._stats.tensors += 1

    def _chunks(self, chunk_bytes: int) -> Iterator[memoryview]:
        yield from byte_chunks(self.job.take(self.part), chunk_bytes)


def is_lazy(data: Any) -> bool:
    return isinstance(data, _Lazy)


