"""Quantized codes and scales of a streamed checkpoint weight, computed when they are written.

A checkpoint bigger than memory is streamed into the artifact tensor by tensor; quantizing it
must hold neither every weight at once nor one whole weight with its float32 copies. Each
quantized weight becomes two handles (codes, scales) sharing one job. With a rule that works
on independent units (`passes.quantize_weights.BlockRule`: rows, or experts of a stack), the
job reads its source a slice of units at a time (`_Lazy.slices`): the scales are a pass over
the source, the codes another that yields each slice's codes to the writer as they are made.
Nothing but the float32 scales (a 32nd of the source's float32 bytes in groups of 128) is kept
between the two handles: the writer puts a shard's 2-byte scales before its 1-byte codes, so
keeping the codes instead would hold every code of the shard.

A rule that is a plain function of the whole tensor is run on the source read whole, and the
part not taken yet is kept until its handle takes it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from compiler.ir import DType

from .lazy import CHUNK_BYTES, StreamStats, _Lazy, byte_chunks

Quantizer = Callable[[Any, int, int], tuple[Any, Any]]
_SLICED = ("scales", "codes", "stored", "unit")  # what a rule that works in slices offers


class QuantizeJob:
    """Quantizes `source` for its two handles (see the module docstring)."""

    def __init__(self, source: _Lazy, bits: int, group_size: int, quantize: Quantizer,
                 shapes: tuple | None = None, scale_dtype: DType | None = None):
        self.source, self.bits, self.group_size, self.quantize = source, bits, group_size, quantize
        self.scale_dtype = scale_dtype or source.ir_dtype
        if shapes is None:  # quantize_weights' rule on a [N, K] weight
            n, k = source.shape
            shapes = ((n, k // group_size, group_size * bits // 8), (n * (k // group_size),))
        self.shapes = {"codes": tuple(shapes[0]), "scales": tuple(shapes[1])}
        self._results: dict[str, Any] = {}  # a whole-tensor rule's part not taken yet
        self._scales: Any = None  # a sliced rule's float32 scales, until both parts are taken
        self._taken: set[str] = set()

    def handles(self) -> tuple[LazyQuantized, LazyQuantized]:
        return LazyQuantized(self, "codes"), LazyQuantized(self, "scales")

    def chunks(self, part: str, chunk_bytes: int) -> Iterator[memoryview]:
        """The raw bytes of `part`, checked against its handle's dtype and shape."""
        dtype = DType.u8 if part == "codes" else self.scale_dtype
        want, done = math.prod(self.shapes[part]) * dtype.itemsize, 0
        if not all(hasattr(self.quantize, a) for a in _SLICED):
            pieces = byte_chunks(self._checked(self.take(part), dtype, part), chunk_bytes)
        elif part == "codes":
            pieces = self._sliced_codes(chunk_bytes)
        else:
            pieces = byte_chunks(self._checked(self._sliced_scales(), dtype, part), chunk_bytes)
        for piece in pieces:
            done += piece.nbytes
            yield piece
        if done != want:
            raise ValueError(f"quantizing {self.source!r} gave {done} bytes of {part}, not the "
                             f"{want} of {dtype}{list(self.shapes[part])}")

    def take(self, part: str) -> Any:
        """`part` of a whole-tensor rule's result: the source read whole, once for both."""
        if not self._results:
            codes, scales = self.quantize(self.source.load(), self.bits, self.group_size)
            self._results = {"codes": codes, "scales": scales}
        return self._results.pop(part) if part in self._results else self._again(part)

    def _again(self, part: str) -> Any:
        """A handle read twice (a pass and the writer, say): quantize again rather than keep."""
        codes, scales = self.quantize(self.source.load(), self.bits, self.group_size)
        return codes if part == "codes" else scales

    @property
    def _stats(self) -> StreamStats:
        return self.source._stats

    # -- rules that work on slices of units ----------------------------------------------------
    def _units(self) -> Iterator[tuple[Any, int]]:
        """The source a slice at a time, shaped [units, *rest], with the slice's first scale's
        index (each unit has unit / group_size scales)."""
        if not self._taken:
            self._stats.quantized += 1
        unit = self.quantize.unit(self.source.shape)
        rest, first = self.source.shape[1:], 0
        for piece in self.source.slices(unit):
            units = piece.numel() // unit
            yield piece.reshape(units, *rest), first
            first += units * (unit // self.group_size)

    def _sliced_scales(self) -> Any:
        import torch

        scales = self._scales
        if scales is None:
            rule = self.quantize
            scales = torch.cat([rule.scales(w, self.bits, self.group_size)
                                for w, _ in self._units()])
        self._done("scales", scales)
        return self.quantize.stored(scales, self.source.ir_dtype.to_torch()).reshape(
            self.shapes["scales"])

    def _sliced_codes(self, chunk_bytes: int) -> Iterator[memoryview]:
        import torch

        rule, kept, made = self.quantize, self._scales, []
        for w, first in self._units():
            if kept is None:
                scales = rule.scales(w, self.bits, self.group_size)
                made.append(scales)
            else:
                scales = kept[first:first + w.numel() // self.group_size]
            yield from byte_chunks(rule.codes(w, scales, self.bits, self.group_size),
                                   chunk_bytes)
        self._done("codes", kept if kept is not None else torch.cat(made))

    def _done(self, part: str, scales: Any) -> None:
        """`part` was taken: keep the float32 scales only while the other part is to come."""
        self._taken.add(part)
        self._scales = None if {"codes", "scales"} <= self._taken else scales

    def _checked(self, tensor: Any, dtype: DType, part: str) -> Any:
        import torch

        tensor = torch.as_tensor(tensor)
        if tensor.dtype != dtype.to_torch():
            raise ValueError(f"quantizing {self.source!r} gave {part} of {tensor.dtype}, not "
                             f"{dtype}")
        return tensor


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
        yield from self.job.chunks(self.part, chunk_bytes)


def is_lazy(data: Any) -> bool:
    return isinstance(data, _Lazy)
