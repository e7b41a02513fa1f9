"""A Hugging Face checkpoint folder on disk: config.json, the shard files and where each tensor is.

Two layouts exist: one `model.safetensors`, or shards `model-0000N-of-0000M.safetensors` listed by
`model.safetensors.index.json` (`weight_map`: tensor name -> shard file). Only headers are read
here; tensor data stays on disk until a `LazyTensor` streams it. Every header is checked against
its file before anything trusts it (offsets inside the file, sizes that match the shapes, no
overlaps, holes or truncation), because a newly published checkpoint is exactly where a broken
upload or a half-finished download shows up, and it should be named here, not crash later.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compiler.errors import DayzeroError
from compiler.ir import DType

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
MAX_HEADER_BYTES = 100 * 2**20  # the safetensors library's own limit

# safetensors dtype tag -> IR dtype (runtime.safetensors_io holds the same table for artifacts;
# the compiler reads checkpoints without importing the runtime's writer)
ST_DTYPES: dict[str, DType] = {
    "F64": DType.f64, "F32": DType.f32, "F16": DType.f16, "BF16": DType.bf16,
    "F8_E4M3": DType.f8e4m3, "F8_E5M2": DType.f8e5m2, "I64": DType.i64, "I32": DType.i32,
    "I16": DType.i16, "I8": DType.i8, "U8": DType.u8, "BOOL": DType.bool,
}


class CheckpointError(DayzeroError):
    """A checkpoint folder that is incomplete, corrupted or does not match its model."""


@dataclass(frozen=True)
class TensorRecord:
    """One tensor of a checkpoint: its shard file and absolute byte range in that file."""

    name: str
    file: str
    dtype: DType
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass
class CheckpointLayout:
    """What a checkpoint folder holds, headers only: config, shard files, tensor records."""

    root: Path
    config: dict[str, Any]
    files: list[str]
    tensors: dict[str, TensorRecord]
    index: str | None = None

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def path(self, file: str) -> Path:
        return self.root / file

    def where(self, name: str) -> str:
        """`tensor 'x' in model-00002-of-00003.safetensors` for error messages."""
        record = self.tensors.get(name)
        return f"tensor '{name}' in {self.root / record.file}" if record else f"tensor '{name}'"


def read_layout(root: str | Path) -> CheckpointLayout:
    """Read and check config.json, the index (if sharded) and every shard's header."""
    root = Path(root)
    if not root.is_dir():
        raise CheckpointError(f"checkpoint folder {root} does not exist", str(root),
                              "give the folder holding config.json and the *.safetensors files")
    config = read_config(root)
    if (root / INDEX).is_file():
        files, expected = _read_index(root)
        index = INDEX
    elif (root / SINGLE).is_file():
        files, expected, index = [SINGLE], None, None
    else:
        found = sorted(p.name for p in root.glob("*.safetensors"))
        hint = (f"it has {', '.join(found[:4])} but no {INDEX} naming them" if found
                else "it has no *.safetensors files")
        raise CheckpointError(f"checkpoint folder {root} has no {SINGLE} and no {INDEX}: {hint}",
                              str(root), f"add the index ({INDEX}) or the weights file "
                              "(.bin/.pt checkpoints are not read: they need pickle)")
    tensors: dict[str, TensorRecord] = {}
    for file in files:
        for record in read_header(root / file, file).values():
            if record.name in tensors:
                raise CheckpointError(
                    f"tensor '{record.name}' is stored twice, in {tensors[record.name].file} and "
                    f"{file}", str(root / file), "remove one copy (the index maps each name to "
                    "one file)")
            tensors[record.name] = record
    if expected is not None:
        _check_index(root, expected, tensors)
    return CheckpointLayout(root, config, files, tensors, index)


def read_config(root: Path) -> dict[str, Any]:
    path = root / CONFIG
    if not path.is_file():
        raise CheckpointError(f"checkpoint folder {root} has no {CONFIG}", str(path),
                              "add the model's config.json (it says which architecture to build)")
    data = _read_json(path)
    if not isinstance(data, dict):
        raise CheckpointError(f"{CONFIG} is not a JSON object", str(path), "fix the file")
    return data


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path.name} is not valid JSON ({exc})", str(path),
                              "the file is corrupted; download it again") from None


def _read_index(root: Path) -> tuple[list[str], dict[str, str]]:
    """Shard files (in first-use order) and the index's name -> file map, checked for shape."""
    path = root / INDEX
    data = _read_json(path)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise CheckpointError(f"{INDEX} has no valid 'weight_map' (tensor name -> file)",
                              str(path), "the index is corrupted; download it again")
    files = sorted(set(weight_map.values()))
    for file in files:
        if Path(file).name != file or file in (".", ".."):
            raise CheckpointError(f"{INDEX} names shard '{file}', which is not a file in the "
                                  "checkpoint folder", str(path), "shard names must be plain "
                                  "file names next to the index")
    missing = [f for f in files if not (root / f).is_file()]
    if missing:
        names = [n for n, f in weight_map.items() if f == missing[0]]
        raise CheckpointError(
            f"{len(missing)} shard file(s) named by {INDEX} are missing: {', '.join(missing)}",
            str(root / missing[0]), f"download the missing shard(s) (the first holds "
            f"{len(names)} tensors, e.g. '{names[0]}')")
    return files, weight_map


def _check_index(root: Path, expected: dict[str, str], tensors: dict[str, TensorRecord]) -> None:
    """The index and the shard headers agree: each indexed name is in the file it points to."""
    wrong = []
    for name, file in expected.items():
        record = tensors.get(name)
        if record is None or record.file != file:
            found = f"it is in {record.file}" if record else "no shard holds it"
            wrong.append(f"'{name}' (index says {file}, {found})")
    if wrong:
        raise CheckpointError(
            f"{INDEX} names {len(wrong)} tensor(s) its shards do not hold where it says: "
            + "; ".join(wrong[:10]) + (" ..." if len(wrong) > 10 else ""),
            str(root / INDEX), "download the checkpoint again: the index and the shards are "
            "from different uploads")


def read_header(path: Path, label: str) -> dict[str, TensorRecord]:
    """A safetensors file's records, after checking the header against the file.

    Checks: the length prefix fits the file, the header is a JSON object, every dtype is known,
    every byte range matches its shape, and the ranges tile the data region exactly (no overlap,
    no hole, no truncation, no trailing bytes). `label` names the file in records and errors.
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise _bad(path, f"is {size} bytes, too short for a safetensors header")
        (length,) = struct.unpack("<Q", prefix)
        if length > min(size - 8, MAX_HEADER_BYTES):
            raise _bad(path, f"declares a {length}-byte header but the file has {size} bytes "
                             "(truncated, or not a safetensors file)")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _bad(path, f"has a header that is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise _bad(path, "has a header that is not a JSON object")
    start = 8 + length
    records = [_record(path, label, name, info, start) for name, info in header.items()
               if name != "__metadata__"]
    _check_tiling(path, records, start, size)
    return {r.name: r for r in records}


def _record(path: Path, label: str, name: str, info: Any, start: int) -> TensorRecord:
    try:
        dtype = ST_DTYPES[info["dtype"]]
        shape = tuple(info["shape"])
        begin, end = info["data_offsets"]
        ok = all(type(x) is int and x >= 0 for x in (*shape, begin, end)) and begin <= end
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise _bad(path, f"has an unreadable header entry for tensor '{name}': {info!r}", name)
    need = math.prod(shape) * dtype.itemsize
    if end - begin != need:
        raise _bad(path, f"says tensor '{name}' ({dtype}{list(shape)}, {need} bytes) spans "
                         f"bytes {begin}..{end} ({end - begin} bytes): the header lies about "
                         "its offsets", name)
    return TensorRecord(name, label, dtype, shape, start + begin, start + end)


def _check_tiling(path: Path, records: list[TensorRecord], start: int, size: int) -> None:
    cursor = start
    for record in sorted(records, key=lambda r: (r.begin, r.end)):
        if record.begin != cursor:
            what = "overlaps the tensor before it" if record.begin < cursor else \
                "leaves a hole before it"
            raise _bad(path, f"places tensor '{record.name}' at offset {record.begin - start}, "
                             f"which {what}: the header lies about its offsets", record.name)
        cursor = record.end
    if cursor > size:
        last = max(records, key=lambda r: r.end)
        raise _bad(path, f"is truncated: its header needs {cursor} bytes, the file has {size}",
                   last.name)
    if cursor < size:
        raise _bad(path, f"has {size - cursor} stray bytes after its last tensor")


def _bad(path: Path, what: str, tensor: str | None = None) -> CheckpointError:
    where = f"{path}" + (f", tensor '{tensor}'" if tensor else "")
    return CheckpointError(f"shard {path.name} {what}", where,
                           "the file is corrupted or incompletely downloaded; download it again")
