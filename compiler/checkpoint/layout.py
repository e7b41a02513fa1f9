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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compiler.errors import DayzeroError
from compiler.ir import DType
from runtime import safetensors_io

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


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
    # a block-scaled FP8 weight (see fp8.py): `dtype` is its dequantized value's, `stored` the
    # dtype of its bytes, `scale` the record of its block scales, `block` a block's shape
    stored: DType | None = None
    scale: TensorRecord | None = None
    block: tuple[int, int] | None = None

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
    from .fp8 import attach_scales  # it builds on this module's records

    return CheckpointLayout(root, config, files, attach_scales(config, tensors, str(root)), index)


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
    """A shard's records, after the artifact reader's checks of the header against the file
    (runtime.safetensors_io.read_header), with errors worded for a downloaded checkpoint."""
    entries = safetensors_io.read_header(path, label,
                                         error=lambda what, tensor: _bad(path, what, tensor))
    return {name: TensorRecord(name, label, e.dtype, e.shape, e.begin, e.end)
            for name, e in entries.items()}


def _bad(path: Path, what: str, tensor: str | None = None) -> CheckpointError:
    where = f"{path}" + (f", tensor '{tensor}'" if tensor else "")
    return CheckpointError(f"shard {path.name} {what}", where,
                           "the file is corrupted or incompletely downloaded; download it again")
