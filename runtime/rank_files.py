"""Where a partitioned model's files lie: one graph, weight shards and payload per rank.

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
partitioned model; communication stays with the runtime. The writer is compile time's
(`compiler.writer.rank_writer`); this module names the paths both sides agree on.
"""

from __future__ import annotations

GRAPHS_DIR = "graphs"


def rank_graph_path(rank: int) -> str:
    return f"{GRAPHS_DIR}/rank-{rank}.dzir"


def segment_payload_dir(rank: int, segment: int) -> str:
    return f"rank-{rank}/seg-{segment}"
