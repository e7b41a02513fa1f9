"""The parallel part of `dayzero inspect`: mesh, pipeline stages and the communication report.

The report is computed from the rank graphs stored in the artifact (so it always describes what
will run), per rank: each collective, its payload and the bytes the rank sends.
"""

from __future__ import annotations

from typing import Any

from ..ir import Graph, parse_ir
from ..ir.ops.collective import COMMUNICATION_OPS


def rank_graphs(artifact) -> dict[int, Graph]:
    """Every rank's graph of a partitioned artifact, parsed."""
    ranks = artifact.manifest["parallel"]["ranks"]
    return {r["rank"]: parse_ir(artifact.graph_text(r["rank"]),
                                source=f"{artifact.root}/{r['graph']}") for r in ranks}


def is_partitioned(manifest: dict[str, Any] | None) -> bool:
    return bool(manifest) and manifest.get("parallel", {}).get("world_size", 1) > 1


def report_for(graphs: dict[int, Graph]) -> dict[str, Any] | None:
    """The communication report, or None when no graph communicates."""
    from passes.parallel.report import communication_report

    if not any(n.op in COMMUNICATION_OPS for g in graphs.values() for n in g.nodes):
        return None
    return communication_report(graphs)


def summary(manifest: dict[str, Any], report: dict[str, Any] | None) -> str:
    """Comment lines (`# ...`) describing the mesh, the stages and the communication."""
    from passes.parallel.report import format_report

    par = manifest["parallel"]
    tp, ep = par.get("tensor_parallel", 1), par.get("expert_parallel", 1)
    inner = f"tensor {tp}" if ep == 1 else \
        f"tensor/expert {max(tp, ep)} (tensor {tp}, expert {ep}: the same ranks)"
    lines = [f"parallel: world size {par['world_size']} = data {par.get('data_parallel', 1)} x "
             f"pipeline {par.get('pipeline_parallel', 1)} x {inner}"]
    for r in par.get("ranks", []):
        coords = r.get("coords", {})
        experts = f", ep {coords['ep']}" if "ep" in coords else ""
        lines.append(f"rank {r['rank']}: dp {coords.get('dp', 0)}, pp {coords.get('pp', 0)}, "
                     f"tp {coords.get('tp', 0)}{experts}; {r['graph']}, {len(r['weights'])} weight "
                     f"file(s), {r.get('segments', 1)} backend segment(s)")
    for s in par.get("stages", []):
        lines.append(f"stage {s['stage']}: nodes {s['nodes'][0]}..{s['nodes'][1] - 1}, "
                     f"{s['flops']} FLOPs, {s['weight_bytes']} B weights, receives "
                     f"{s['recv_bytes']} B, cost {s['cost']}")
    if len(par.get("stages", [])) > 1:
        lines.append(f"stage imbalance: {par['imbalance']:.2%} (slowest stage over the mean)")
    if report is not None:
        lines.extend(format_report(report).splitlines())
    return "\n".join(lines)


def comment(text: str) -> str:
    return "".join(f"# {line}\n" if not line.startswith("#") else f"{line}\n"
                   for line in text.splitlines())
