"""Lazy tensor handles: a checkpoint tensor that is read, converted and dropped only when used.

A `LazyTensor` stands in `graph.weight_data` for a tensor that still lies in a checkpoint shard.
The artifact writer streams it in chunks (`iter_chunks`) straight from the shard's mmap into the
artifact's file, converting dtype chunk by chunk, and then hands the pages back to the kernel
(`madvise(MADV_DONTNEED)`): the process's resident memory holds one chunk, never a shard, let
alone the model. A pass that needs the values (constant folding, say) gets a real torch tensor
through `torch.as_tensor(handle)` (the DLPack protocol) or `np.asarray(handle)`; only that
tensor is read, by the safetensors library's own reader (`safe_open`) on top of the header checks
`read_layout` made. Streaming stays on our mmap: it needs the tensors' byte offsets (which
`safe_open` does not expose) and must hand pages back chunk by chunk, which a reader that owns
its mapping cannot.

`ShardReader` owns the mmaps and `safe_open` handles, one per shard, and counts what was
streamed for the summary.
"""

from __future__ import annotations

import mmap
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.ir import DType
from compiler.ir.weights import Quantizer, concat_rows  # noqa: F401  (concat_rows re-exported)

from . import precision
from .layout import CheckpointError, CheckpointLayout, TensorRecord

CHUNK_BYTES = 64 * 2**20
SLICE_BYTES = 16 * 2**20  # what a sliced computation (quantization) holds of its source
_PAGE = mmap.PAGESIZE


@dataclass
class StreamStats:
    """What streaming did: for the summary line and for tests."""

    tensors: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    shards_opened: list[str] = field(default_factory=list)
    conversions: Counter = field(default_factory=Counter)  # (source, target) -> tensor count
    # tensors read whole: by a pass (torch.as_tensor / np.asarray), or at write time by a
    # deferred job (a fold, a conversion) that computes from one source tensor at a time
    materialized: int = 0
    # tensors quantized at write time a slice of rows (or experts) at a time, never whole
    quantized: int = 0

    def summary(self, total_shards: int) -> str:
        changes = ", ".join(f"{s}->{t} x{n}" for (s, t), n in sorted(
            self.conversions.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1])))) or "none"
        line = (f"streamed {self.tensors} tensors from {len(self.shards_opened)}/{total_shards} "
                f"shards: {_size(self.bytes_read)} read, {_size(self.bytes_written)} written; "
                f"dtype changes: {changes}")
        if self.materialized:
            line += (f"; {self.materialized} tensors read whole (to fold or convert them, one "
                     "at a time)")
        if self.quantized:
            line += f"; {self.quantized} tensors quantized a slice at a time"
        return line


class ShardReader:
    """Maps each shard of a checkpoint once (private, read-only use) and reads byte ranges."""

    def __init__(self, layout: CheckpointLayout,
                 on_shard: Callable[[int, int, str], Any] | None = None):
        self.layout = layout
        self.stats = StreamStats()
        self.on_shard = on_shard
        self._maps: dict[str, mmap.mmap] = {}
        self._opened: dict[str, Any] = {}

    def map(self, file: str) -> mmap.mmap:
        mm = self._maps.get(file)
        if mm is None:
            with open(self.layout.path(file), "rb") as f:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            if hasattr(mm, "madvise"):
                mm.madvise(mmap.MADV_SEQUENTIAL)  # larger readahead: shards are read in order
            self._maps[file] = mm
            self.stats.shards_opened.append(file)
            if self.on_shard is not None:
                self.on_shard(len(self.stats.shards_opened), len(self.layout.files), file)
        return mm

    def release(self, file: str, begin: int, end: int) -> None:
        """Drop the pages of [begin, end) from this process (the page cache keeps them)."""
        mm = self._maps.get(file)
        start = begin - begin % _PAGE
        if mm is None or end <= start or not hasattr(mm, "madvise"):
            return
        mm.madvise(mmap.MADV_DONTNEED, start, min(end, len(mm)) - start)

    def prefetch(self, file: str, begin: int, end: int) -> None:
        """Ask the kernel to start reading [begin, end) now, while the caller works on the
        previous chunk (hashing and writing it), so disk reads overlap the rest."""
        mm = self._maps.get(file)
        start = begin - begin % _PAGE
        if mm is not None and end > start and hasattr(mm, "madvise"):
            mm.madvise(mmap.MADV_WILLNEED, start, min(end, len(mm)) - start)

    def tensor(self, record: TensorRecord) -> Any:
        """The whole tensor as stored (torch), read through `safe_open`; a shard
        the library refuses, or that no longer holds what its header said when the checkpoint
        was opened, is a CheckpointError naming the shard and the tensor."""
        from safetensors import SafetensorError, safe_open

        path = self.layout.path(record.file)
        try:
            if record.file not in self._opened:
                self._opened[record.file] = safe_open(path, framework="pt")
            tensor = self._opened[record.file].get_tensor(record.name)
        except (SafetensorError, OSError) as exc:
            raise _unreadable(path, record, f"cannot be read: {exc}") from None
        if (str(tensor.dtype), tuple(tensor.shape)) != (str(record.dtype.to_torch()),
                                                        record.shape):
            raise _unreadable(path, record, f"now holds {tensor.dtype}{list(tensor.shape)}, not "
                              f"the {record.dtype}{list(record.shape)} its header said when opened")
        return tensor

    def close(self) -> None:
        self._opened.clear()
        for mm in self._maps.values():
            try:
                mm.close()
            except BufferError:  # a tensor a pass materialized still views it; GC unmaps later
                pass
        self._maps.clear()

    def handle(self, record: TensorRecord, target: DType | None = None) -> _Lazy:
        if record.scale is not None:  # a block-scaled FP8 weight, dequantized when read
            from .fp8 import BlockDequantized  # it builds on this module

            return BlockDequantized(self, record, target or record.dtype)
        return LazyTensor(self, record, target or record.dtype)


class _Lazy:
    """What every lazy handle offers: torch-like attributes, streaming, and reading on demand.

    Subclasses give `shape`, `ir_dtype`, `_stats`, `iter_chunks(chunk_bytes)` (the writer's
    path, counted in the summary) and `_chunks(chunk_bytes)` (uncounted, for `load`).
    """

    __slots__ = ()

    @property
    def dtype(self):
        """The torch dtype of the data this handle yields (torch tensors' attribute)."""
        return self.ir_dtype.to_torch()

    @property
    def nbytes(self) -> int:
        return self.numel() * self.ir_dtype.itemsize

    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def load(self) -> Any:
        """The whole tensor as a new torch tensor of `ir_dtype` (for passes that compute on it)."""
        import torch

        out = torch.empty(self.shape, dtype=self.ir_dtype.to_torch())
        flat = out.reshape(-1).view(torch.uint8).numpy()
        pos = 0
        for chunk in self._chunks(CHUNK_BYTES):
            flat[pos:pos + len(chunk)] = np.frombuffer(chunk, dtype=np.uint8)
            pos += len(chunk)
        self._stats.materialized += 1
        return out

    def slices(self, unit: int, slice_bytes: int = SLICE_BYTES) -> Iterator[Any]:
        """The tensor as flat torch tensors of `ir_dtype` holding whole units of `unit`
        elements (rows, experts), about `slice_bytes` each, in order: for a computation that
        works on units independently (quantization), so the tensor is never read whole.

        Each slice is a view of one reused buffer, valid until the next is asked for."""
        import torch

        if unit <= 0 or self.numel() % unit:
            raise ValueError(f"{self!r} does not split into units of {unit} elements")
        unit_bytes = unit * self.ir_dtype.itemsize
        buffer = torch.empty(max(1, slice_bytes // unit_bytes) * unit_bytes, dtype=torch.uint8)
        flat, fill = buffer.numpy(), 0
        for chunk in self._chunks(len(buffer)):
            data, pos = np.frombuffer(chunk, dtype=np.uint8), 0
            while pos < len(data):
                n = min(len(flat) - fill, len(data) - pos)
                flat[fill:fill + n] = data[pos:pos + n]
                fill, pos = fill + n, pos + n
                if fill == len(flat):
                    yield buffer.view(self.ir_dtype.to_torch())
                    fill = 0
        if fill:
            yield buffer[:fill].view(self.ir_dtype.to_torch())

    # -- interop: torch.as_tensor(handle), np.asarray(handle) --------------------------------
    def __dlpack__(self, *args, **kwargs):
        return self.load().__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU, device 0

    def __array__(self, dtype=None, copy=None):
        array = self.load().view(_bits(self.ir_dtype)).numpy().view(self.ir_dtype.to_numpy())
        return array if dtype is None else array.astype(dtype)

    def reshape(self, *shape):
        return self.load().reshape(*shape)

    # -- the rest of compiler.ir.weights.LazyWeight: what passes may ask without reading --------
    def concat_rows_lazily(self, rest: Sequence[Any]) -> LazyConcat | None:
        if not all(isinstance(p, _Lazy) for p in rest):
            return None
        try:
            return LazyConcat([self, *rest])
        except ValueError:
            return None

    def quantize_lazily(self, bits: int, group_size: int, quantize: Quantizer,
                        shapes: tuple | None = None, scale_dtype: DType | None = None) -> tuple:
        from .lazy_quantized import QuantizeJob  # it builds on this module

        return QuantizeJob(self, bits, group_size, quantize, shapes, scale_dtype).handles()

    def map_lazily(self, fn: Callable[[Any], Any], shape: tuple[int, ...],
                   dtype: DType) -> Any:
        from .lazy_converted import ConvertJob, LazyConverted  # they build on this module

        return LazyConverted(ConvertJob([self], lambda sources: {"value": fn(sources[0])}),
                             "value", shape, dtype)


class LazyTensor(_Lazy):
    """A checkpoint tensor converted to `ir_dtype` on read; see the module docstring."""

    __slots__ = ("reader", "record", "ir_dtype")

    def __init__(self, reader: ShardReader, record: TensorRecord, ir_dtype: DType):
        if not precision.convertible(record.dtype, ir_dtype):
            raise ValueError(f"cannot map {record.dtype} tensor {record.name} to {ir_dtype}")
        self.reader = reader
        self.record = record
        self.ir_dtype = ir_dtype

    def __repr__(self) -> str:
        conv = f" (stored {self.record.dtype})" if self.record.dtype != self.ir_dtype else ""
        return (f"LazyTensor({self.record.name}: {self.ir_dtype}{list(self.shape)}{conv}, "
                f"{self.record.file})")

    @property
    def shape(self) -> tuple[int, ...]:
        return self.record.shape

    @property
    def _stats(self) -> StreamStats:
        return self.reader.stats

    def astype_lazy(self, dtype: DType) -> LazyTensor:
        """The same checkpoint tensor, to be converted to `dtype` instead (nothing is read)."""
        return type(self)(self.reader, self.record, dtype)

    def load(self) -> Any:
        """The whole tensor as a new torch tensor of `ir_dtype`, read by `safe_open` and
        converted with the overflow check."""
        tensor = self.reader.tensor(self.record)
        if self.record.dtype != self.ir_dtype:
            tensor = precision.convert(tensor, self.ir_dtype, self.record.name)
        else:  # safe_open's tensors may view one mapping of the shard: never share it
            tensor = tensor.clone()
        self._stats.materialized += 1
        return tensor

    def iter_chunks(self, chunk_bytes: int = CHUNK_BYTES) -> Iterator[memoryview]:
        """The converted tensor's raw little-endian bytes, a bounded chunk at a time.

        This is the artifact writer's path, so it counts in the streaming summary.
        """
        stats, record = self.reader.stats, self.record
        for chunk in self._chunks(chunk_bytes):
            yield chunk
            n = chunk.nbytes // self.ir_dtype.itemsize
            stats.bytes_read += n * record.dtype.itemsize
            stats.bytes_written += chunk.nbytes
        stats.tensors += 1
        if record.dtype != self.ir_dtype:
            stats.conversions[(record.dtype.value, self.ir_dtype.value)] += 1

    def _chunks(self, chunk_bytes: int) -> Iterator[memoryview]:
        """Converted chunks; each chunk's source pages are dropped once it is consumed, and the
        next chunk's are read ahead meanwhile."""
        record = self.record
        src_size = record.dtype.itemsize
        count = self.numel()
        step = max(1, chunk_bytes // max(src_size, self.ir_dtype.itemsize))
        mm = self.reader.map(record.file) if count else None
        for first in range(0, count, step):
            n = min(step, count - first)
            begin = record.begin + first * src_size
            end = begin + n * src_size
            self.reader.prefetch(record.file, end, min(end + step * src_size, record.end))
            try:
                yield self._convert_chunk(mm, begin, n)
            finally:
                self.reader.release(record.file, begin, end)

    def _convert_chunk(self, mm: mmap.mmap, begin: int, n: int) -> memoryview:
        import torch

        source = self.record.dtype
        if source == self.ir_dtype:
            return memoryview(mm)[begin:begin + n * source.itemsize]
        src = _view(mm, begin, n, source)
        out = src.to(self.ir_dtype.to_torch())
        if precision.may_overflow(source, self.ir_dtype) and bool(torch.isinf(out).any()):
            precision.check_overflow(src, out, self.record.name, self.ir_dtype)
        return memoryview(out.view(torch.uint8).numpy())


class LazyConcat(_Lazy):
    """Lazy handles concatenated along their first dim (a horizontally fused QKV weight, say).

    Row-major tensors concatenated along dim 0 are their bytes one after the other, so the
    merged weight streams part by part and is never assembled in memory.
    """

    __slots__ = ("parts",)

    def __init__(self, parts: Sequence[_Lazy]):
        rest = {tuple(p.shape[1:]) for p in parts}
        dtypes = {p.ir_dtype for p in parts}
        if not parts or len(rest) != 1 or len(dtypes) != 1 or any(not p.shape for p in parts):
            raise ValueError("LazyConcat needs handles of one dtype and the same trailing dims")
        self.parts = tuple(parts)

    def __repr__(self) -> str:
        return f"LazyConcat({self.ir_dtype}{list(self.shape)}, {len(self.parts)} parts)"

    @property
    def shape(self) -> tuple[int, ...]:
        return (sum(p.shape[0] for p in self.parts), *self.parts[0].shape[1:])

    @property
    def ir_dtype(self) -> DType:
        return self.parts[0].ir_dtype

    @property
    def _stats(self) -> StreamStats:
        return self.parts[0]._stats

    def astype_lazy(self, dtype: DType) -> LazyConcat:
        return LazyConcat([p.astype_lazy(dtype) for p in self.parts])

    def iter_chunks(self, chunk_bytes: int = CHUNK_BYTES) -> Iterator[memoryview]:
        for part in self.parts:
            yield from part.iter_chunks(chunk_bytes)

    def _chunks(self, chunk_bytes: int) -> Iterator[memoryview]:
        for part in self.parts:
            yield from part._chunks(chunk_bytes)


def _unreadable(path, record: TensorRecord, what: str) -> CheckpointError:
    return CheckpointError(f"shard {record.file} {what}", f"{path}, tensor '{record.name}'",
                           "the file is corrupted, or changed while compiling; download it again")


def byte_chunks(tensor: Any, chunk_bytes: int) -> Iterator[memoryview]:
    """A tensor computed whole (a conversion's, a quantization's) as its raw bytes, in chunks of
    at most `chunk_bytes`: the writer's interface for handles that cannot stream their source."""
    import torch

    raw = memoryview(torch.as_tensor(tensor).contiguous().reshape(-1).view(torch.uint8).numpy())
    for first in range(0, len(raw), max(1, chunk_bytes)):
        yield raw[first:first + chunk_bytes]


def _view(mm: mmap.mmap, begin: int, n: int, dtype: DType):
    """`n` elements of `dtype` at byte `begin` of the map, as torch (copied if unaligned)."""
    import torch

    if begin % dtype.itemsize:
        raw = bytearray(mm[begin:begin + n * dtype.itemsize])
        return torch.frombuffer(raw, dtype=dtype.to_torch(), count=n)
    with warnings.catch_warnings():
        # the map is read-only and the view is only ever read (converted into a new tensor)
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        return torch.frombuffer(mm, dtype=dtype.to_torch(), count=n, offset=begin)


def _bits(dtype: DType):
    """A torch integer dtype of the same width, to move bf16/fp8 bits into numpy."""
    import torch

    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n:.1f} GB"
