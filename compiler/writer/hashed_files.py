"""Files of an artifact, each written with its size and sha256 recorded for the manifest.

Shared by the single-model writer (`artifact_writer`) and the per-rank writer (`rank_writer`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from backends import WeightLocation
from compiler.errors import DayzeroError
from compiler.ir import Graph, symbolic
from runtime import safetensors_io as st
from runtime.artifact import WEIGHTS_DIR


def put_file(root: Path, rel: str, data: bytes, files: dict[str, dict[str, Any]]) -> None:
    """Write `data` at `rel` under `root` and record its size and hash in `files`.

    Each file is created, never overwritten: two parts of a compile naming the same file (an
    extra file and a payload file, say) is an error, not a silent loss of one of them."""
    path = root / rel
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "xb") as f:
            f.write(data)
    except (FileExistsError, NotADirectoryError):
        raise DayzeroError(f"two files of the artifact would be written at {rel}", rel,
                           "give the extra or payload files distinct paths") from None
    files[rel] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def write_weights(root: Path, graph: Graph, files: dict[str, dict[str, Any]], progress,
                  shard_bytes: int, folder: str = WEIGHTS_DIR
                  ) -> tuple[dict[str, WeightLocation], list[str]]:
    """The graph's weights as safetensors shards in `folder`, recorded in `files`; returns
    where each weight's bytes lie (what `lower` needs) and the shard files."""
    specs = {name: _weight_spec(graph, name) for name in graph.weights}
    sizes = [(name, _nbytes(*spec)) for name, spec in specs.items()]
    shards = st.plan_shards(sizes, shard_bytes)
    try:
        (root / folder).mkdir(parents=True)
    except FileExistsError:
        raise DayzeroError(f"the weights folder {folder}/ already holds other files", folder,
                           "give the extra files paths outside it") from None
    locations: dict[str, WeightLocation] = {}
    shard_files = []
    for index, names in enumerate(shards):
        rel = f"{folder}/model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        entries, digest, size = st.write_file(root / rel, {n: specs[n] for n in names},
                                              graph.weight_data, progress)
        files[rel] = {"size": size, "sha256": digest}
        shard_files.append(rel)
        for e in entries:
            locations[e.name] = WeightLocation(rel, e.begin, e.nbytes, e.dtype.value, e.shape)
    return locations, shard_files


def _weight_spec(graph: Graph, name: str):
    value = graph.weights[name]
    if not all(symbolic.is_static(d) for d in value.type.shape):
        raise DayzeroError(f"weight '{name}' has a symbolic shape {value.type}", f"weight {name}",
                           "weights must have static shapes")
    if name not in graph.weight_data:
        raise DayzeroError(f"weight '{name}' has no data in graph.weight_data", f"weight {name}",
                           "load or export the model's weights before writing the artifact")
    return value.type.dtype, tuple(int(d) for d in value.type.shape)


def _nbytes(dtype, shape) -> int:
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
