"""Writing a partitioned model: one graph, one set of weight shards and one payload per rank.

```
model.dz/
  graph.dzir                        the annotated global graph (for inspection)
  graphs/rank-N.dzir                rank N's program (collectives and transfers included)
  weights/rank-N/*.safetensors      rank N's weight shards
  backend/rank-N/seg-K/...          the backend's payload for compute segment K of rank N
```

Data-parallel replicas hold identical shards: they point at the files of the first rank with the
same pipeline stage and tensor-parallel coordinate instead of storing a copy. The backend lowers
each compute segment (`segments.split_steps`) as a model of its own, so any backend serves a
partitioned model; communication stays with the runtime.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from backends import Backend
from compiler.ir import print_ir

from .segments import split_steps

GRAPHS_DIR = "graphs"


def rank_graph_path(rank: int) -> str:
    return f"{GRAPHS_DIR}/rank-{rank}.dzir"


def segment_payload_dir(rank: int, segment: int) -> str:
    return f"rank-{rank}/seg-{segment}"


def write_ranks(root: Path, ranks: Sequence[Any], backend: Backend, options: dict[str, Any],
                files: dict[str, dict[str, Any]], progress, shard_bytes: int) -> list[dict]:
    """Write every rank's graph, weights and payload; returns the manifest's `ranks` entries."""
    from .artifact import PAYLOAD_DIR, WEIGHTS_DIR, safe_relpath
    from .artifact_writer import _put, _write_weights

    shared: dict[tuple, tuple[list[str], dict]] = {}
    entries = []
    for program in sorted(ranks, key=lambda r: r.rank):
        graph, coords = program.graph, dict(program.coords)
        key = (coords.get("pp", 0), coords.get("tp", 0))
        if key not in shared:
            locations, weight_files = _write_weights(root, graph, files, progress, shard_bytes,
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
                _put(root, f"{PAYLOAD_DIR}/{prefix}/{safe_relpath(rel, 'backend payload')}",
                     data, files)
            segment += 1
        _put(root, rank_graph_path(program.rank), print_ir(graph).encode(), files)
        entries.append({"rank": program.rank, "coords": coords,
                        "graph": rank_graph_path(program.rank), "weights": weight_files,
                        "segments": segment})
    return entries
