"""Writing a partitioned model: one graph, one set of weight shards and one payload per rank
(the layout is `runtime.rank_files`'s)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from backends import Backend
from compiler.ir import print_ir
from runtime.artifact import PAYLOAD_DIR, WEIGHTS_DIR, safe_relpath
from runtime.rank_files import rank_graph_path, segment_payload_dir
from runtime.segments import split_steps

from .hashed_files import put_file, write_weights


def write_ranks(root: Path, ranks: Sequence[Any], backend: Backend, options: dict[str, Any],
                files: dict[str, dict[str, Any]], progress, shard_bytes: int) -> list[dict]:
    """Write every rank's graph, weights and payload; returns the manifest's `ranks` entries."""
    shared: dict[tuple, tuple[list[str], dict]] = {}
    entries = []
    for program in sorted(ranks, key=lambda r: r.rank):
        graph, coords = program.graph, dict(program.coords)
        key = tuple(sorted((axis, c) for axis, c in coords.items() if axis != "dp"))
        if key not in shared:
            locations, weight_files = write_weights(root, graph, files, progress, shard_bytes,
                                                    f"{WEIGHTS_DIR}/rank-{program.rank}")
            shared[key] = (weight_files, locations)
        weight_files, locations = shared[key]
        steps = split_steps(graph)
        segment = 0
        for step in steps:
            if not step.is_compute:
                continue
            payload = backend.lower(step.graph, locations, options)
            prefix = segment_payload_dir(program.rank, segment)
            for rel, data in sorted(payload.items()):
                data = data.encode() if isinstance(data, str) else bytes(data)
                put_file(root, f"{PAYLOAD_DIR}/{prefix}/{safe_relpath(rel, 'backend payload')}",
                         data, files)
            segment += 1
        put_file(root, rank_graph_path(program.rank), print_ir(graph).encode(), files)
        entries.append({"rank": program.rank, "coords": coords,
                        "graph": rank_graph_path(program.rank), "weights": weight_files,
                        "segments": segment})
    return entries
