"""The safetensors weight files of an artifact: streaming writer and strict header reader.

Written by hand rather than through `safetensors.save_file` so that a model larger than memory can
be written one tensor at a time (the header is computed from the IR's declared types first), and so
the writer knows each tensor's absolute byte offset, which backends use to point at weights in place
(ONNX external data) instead of copying them. The files stay standard safetensors: 8-byte
little-endian header length, JSON header, then the tensors back to back without holes.

Within a file, tensors are ordered by element size (largest first) after an 8-byte aligned header,
so every tensor starts at a multiple of its element size and can be viewed in place via mmap.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from compiler.errors import ArtifactError, DayzeroError
from compiler.ir.dtypes import DType

from . import bounded_json

# IR dtype <-> safetensors dtype tag.
ST_DTYPES: dict[DType, str] = {
    DType.f64: "F64", DType.f32: "F32", DType.f16: "F16", DType.bf16: "BF16",
    DType.f8e4m3: "F8_E4M3", DType.f8e5m2: "F8_E5M2", DType.i64: "I64", DType.i32: "I32",
    DType.i16: "I16", DType.i8: "I8", DType.u8: "U8", DType.bool: "BOOL",
}
IR_DTYPES: dict[str, DType] = {tag: dtype for dtype, tag in ST_DTYPES.items()}

MAX_HEADER_BYTES = 100 * 2**20  # the safetensors library's own limit
MAX_HEADER_DEPTH = 8   # {name: {dtype, shape: [...], data_offsets: [...]}}: three levels
MAX_INT_DIGITS = 20    # an offset or dim below 2**64
MAX_TENSORS = 1 << 18  # per file: far past any model's shard
MAX_RANK = 64
MAX_NAME = 4096        # characters of a tensor name
MAX_OFFSET = 2**63 - 1


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors file; `begin`/`end` are absolute byte offsets in the file."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


# -- writing -----------------------------------------------------------------------------------

def plan_shards(sizes: Iterable[tuple[str, int]], shard_bytes: int) -> list[list[str]]:
    """Names grouped into shards of at most `shard_bytes` (a bigger tensor gets its own shard)."""
    shards: list[list[str]] = []
    used = 0
    for name, nbytes in sizes:
        if not shards or (shards[-1] and used + nbytes > shard_bytes):
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += nbytes
    return shards


def layout(specs: Mapping[str, tuple[DType, tuple[int, ...]]]) -> tuple[bytes, list[TensorEntry]]:
    """Header bytes (length prefix included) and entries with absolute offsets, in write order."""
    order = sorted(specs, key=lambda n: -specs[n][0].itemsize)  # stable: keeps the given order
    header: dict[str, Any] = {}
    offset = 0
    relative = []
    for name in order:
        dtype, shape = specs[name]
        nbytes = math.prod(shape) * dtype.itemsize
        header[name] = {"dtype": ST_DTYPES[dtype], "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        relative.append((name, dtype, tuple(shape), offset, offset + nbytes))
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    start = 8 + len(text)
    entries = [TensorEntry(n, d, s, start + b, start + e) for n, d, s, b, e in relative]
    return struct.pack("<Q", len(text)) + text, entries


def write_file(path: Path, specs: Mapping[str, tuple[DType, tuple[int, ...]]],
               data: Mapping[str, Any], progress: Callable[[int], Any] | None = None
               ) -> tuple[list[TensorEntry], str, int]:
    """Write one safetensors file tensor by tensor; returns entries, sha256 hex and size."""
    header, entries = layout(specs)
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        _write(f, digest, header)
        for entry in entries:
            for raw in tensor_chunks(data[entry.name], entry):
                _write(f, digest, raw)
                if progress is not None:
                    progress(raw.nbytes)
        size = f.tell()
    return entries, digest.hexdigest(), size


def tensor_chunks(data: Any, entry: TensorEntry) -> Iterable[memoryview]:
    """The tensor's bytes in one piece, or in bounded chunks from a streaming handle.

    A handle with `iter_chunks()`, `ir_dtype` and `shape` (a checkpoint's lazy tensor) is read
    and converted chunk by chunk, so a weight larger than memory is never held whole.
    """
    chunks = getattr(data, "iter_chunks", None)
    if chunks is None:
        return [tensor_bytes(data, entry)]
    dtype, shape = data.ir_dtype, tuple(data.shape)
    if dtype != entry.dtype or shape != entry.shape:
        raise DayzeroError(f"weight '{entry.name}' streams {dtype}{list(shape)} data but the "
                           f"graph declares {entry.dtype}{list(entry.shape)}",
                           f"weight {entry.name}",
                           "make graph.weight_data agree with the weight declarations")
    return chunks()


def _write(f: BinaryIO, digest, chunk) -> None:
    digest.update(chunk)
    f.write(chunk)


def tensor_bytes(data: Any, entry: TensorEntry) -> memoryview:
    """The raw little-endian bytes of a torch tensor or numpy array, checked against `entry`."""
    if type(data).__module__.split(".")[0] == "torch":
        raw, dtype, shape = _torch_bytes(data, entry.name)
    else:
        array = np.asarray(data)
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        try:
            dtype = DType.from_numpy(array.dtype)
        except TypeError as exc:
            raise DayzeroError(f"weight '{entry.name}' has dtype {array.dtype}, which has no IR "
                               "equivalent", f"weight {entry.name}", "cast the weight") from exc
        shape = tuple(array.shape)
        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    if dtype != entry.dtype or shape != entry.shape:
        raise DayzeroError(f"weight '{entry.name}' holds {dtype}{list(shape)} data but the graph "
                           f"declares {entry.dtype}{list(entry.shape)}", f"weight {entry.name}",
                           "make graph.weight_data agree with the weight declarations")
    return memoryview(raw)


def _torch_bytes(tensor: Any, name: str) -> tuple[np.ndarray, DType, tuple[int, ...]]:
    import torch  # already imported: `tensor` is a torch tensor

    t = tensor.detach()
    if t.device.type == "meta":
        raise DayzeroError(f"weight '{name}' has no data (it is a meta tensor)", f"weight {name}",
                           "load the checkpoint's weights before compiling")
    t = t.cpu().contiguous()
    try:
        dtype = DType.from_torch(t.dtype)
    except TypeError as exc:
        raise DayzeroError(f"weight '{name}' has dtype {t.dtype}, which has no IR equivalent",
                           f"weight {name}", "cast the weight") from exc
    flat = t.reshape(-1)
    if flat.numel() and flat.stride(0) != 1:  # size-1 dims count as contiguous at any stride
        flat = torch.empty(flat.shape, dtype=flat.dtype).copy_(flat)
    return flat.view(torch.uint8).numpy(), dtype, tuple(t.shape)


# -- reading -----------------------------------------------------------------------------------

def read_header(path: Path, label: str,
                error: Callable[[str, str | None], Exception] | None = None,
                ) -> dict[str, TensorEntry]:
    """Entries of a safetensors file, after checking the header is sane and covers the data.

    Checks: the length prefix fits the file, the header is JSON, every dtype is known, every
    tensor's byte range matches its shape and lies in the file, and the ranges tile the data
    region exactly (no overlaps, holes or trailing bytes). `label` names the file in errors;
    `error(what, tensor)` makes the exception (an ArtifactError by default), so the checkpoint
    reader shares these checks and words its own fix.
    """
    bad = error or (lambda what, tensor=None: _bad(label, what))
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise bad(f"is {size} bytes, too short for a safetensors header", None)
        (length,) = struct.unpack("<Q", prefix)
        if length > min(size - 8, MAX_HEADER_BYTES):
            raise bad(f"declares a {length}-byte header but the file has {size} bytes "
                      "(truncated, or not a safetensors file)", None)
        try:
            header = bounded_json.loads(f.read(length), max_depth=MAX_HEADER_DEPTH,
                                        max_int_digits=MAX_INT_DIGITS)
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise bad(f"has a header that is not JSON ({str(exc)[:200]})", None) from None
    if not isinstance(header, dict):
        raise bad("has a header that is not a JSON object", None)
    if len(header) > MAX_TENSORS + 1:
        raise bad(f"lists {len(header)} tensors, more than the {MAX_TENSORS} a file may hold",
                  None)
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise bad("has a __metadata__ entry that is not an object of strings", None)
    start = 8 + length
    entries = [_entry(bad, name, info, start) for name, info in header.items()
               if name != "__metadata__"]
    _check_tiling(bad, entries, start, size)
    return {e.name: e for e in entries}


def _entry(bad, name: str, info: Any, start: int) -> TensorEntry:
    try:
        dtype = IR_DTYPES[info["dtype"]]
        shape = tuple(info["shape"])
        begin, end = info["data_offsets"]
        ok = (isinstance(info["shape"], list) and len(shape) <= MAX_RANK
              and all(type(x) is int and 0 <= x <= MAX_OFFSET for x in (*shape, begin, end))
              and begin <= end and len(name) <= MAX_NAME)
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise bad(f"has an unreadable header entry for tensor {_short(name)}: {_short(info)}",
                  name[:MAX_NAME])
    need = math.prod(shape) * dtype.itemsize
    if end - begin != need:
        raise bad(f"says tensor '{name}' ({dtype}{list(shape)}, {need} bytes) spans bytes "
                  f"{begin}..{end} ({end - begin} bytes): the header lies about its offsets", name)
    return TensorEntry(name, dtype, shape, start + begin, start + end)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _check_tiling(bad, entries: list[TensorEntry], start: int, size: int) -> None:
    cursor = start
    for entry in sorted(entries, key=lambda e: (e.begin, e.end)):
        if entry.begin != cursor:
            what = "overlaps the tensor before it" if entry.begin < cursor else \
                "leaves a hole before it"
            raise bad(f"places tensor '{entry.name}' at offset {entry.begin - start}, which "
                      f"{what}: the header lies about its offsets", entry.name)
        cursor = entry.end
    if cursor > size:
        last = max(entries, key=lambda e: e.end)
        raise bad(f"is truncated: its header needs {cursor} bytes, the file has {size}",
                  last.name)
    if cursor < size:
        raise bad(f"has {size - cursor} stray bytes after its last tensor", None)


def _bad(label: str, what: str) -> ArtifactError:
    return ArtifactError(f"weights file {label} {what}", label,
                         "the file is corrupted or truncated; recompile the artifact")
