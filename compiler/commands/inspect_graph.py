"""`dayzero inspect ARTIFACT --graph FILE.graphml|FILE.dot|FILE.svg`: the IR as a picture.

The graph is a networkx DiGraph: one vertex per graph input, weight and IR node, one edge per
use of a value (labelled with its name and type). IR nodes carry their op, output types, the
node's text line, and, where the artifact records them, the fusion group (`fusion_group`
attribute), the pipeline stage (manifest `parallel.stages`: node index ranges of the global
graph) and the memory slot (manifest `memory_plan`: offset and bytes in the arena, or the value
whose buffer the output shares). GraphML is written by networkx; DOT by `to_dot` below, since
networkx's DOT writers need pydot or pygraphviz, which dayzero does not depend on; SVG is that
DOT rendered by Graphviz's `dot` when it is installed.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import networkx as nx

from ..errors import DayzeroError
from ..ir import Graph, format_node

FORMATS = (".graphml", ".dot", ".gv", ".svg")
# fill colours of fusion groups in DOT/SVG, by group id modulo their number
_PALETTE = ("#cfe2f3", "#d9ead3", "#fff2cc", "#f4cccc", "#d9d2e9", "#fce5cd", "#d0e0e3")


def ir_digraph(graph: Graph, manifest: Mapping[str, Any] | None = None) -> nx.DiGraph:
    """The IR as a DiGraph; stages and memory slots come from `manifest` when it has them
    (pass it only with the graph its node indices refer to: the global graph, not a rank's)."""
    g = nx.DiGraph(name=graph.name)
    producer: dict[int, str] = {}
    for value in graph.inputs:
        producer[id(value)] = _vertex(g, f"input:{value.name}", "input", value.name, value)
    for name, value in graph.weights.items():
        producer[id(value)] = _vertex(g, f"weight:{name}", "weight", name, value)
    stages = _stages(manifest)
    slots = _slots(manifest)
    for index, node in enumerate(graph.nodes):
        key = f"node:{index}"
        types = "; ".join(str(v.type) for v in node.outputs)
        g.add_node(key, kind="op", op=node.op, label=f"{node.op}\n{types}", index=index,
                   outputs=", ".join(v.name for v in node.outputs), types=types,
                   ir=format_node(node, graph))
        if isinstance(node.attrs.get("fusion_group"), int):
            g.nodes[key]["fusion_group"] = node.attrs["fusion_group"]
        if index in stages:
            g.nodes[key]["stage"] = stages[index]
        first = node.outputs[0].name if node.outputs else None
        if first in slots:
            g.nodes[key].update(slots[first])
        for value in node.inputs:
            if value is not None and id(value) in producer:
                g.add_edge(producer[id(value)], key, value=value.name, type=str(value.type))
        for value in node.outputs:
            producer[id(value)] = key
    for i, value in enumerate(graph.outputs):
        key = f"output:{i}"
        _vertex(g, key, "output", value.name, value)
        if id(value) in producer:
            g.add_edge(producer[id(value)], key, value=value.name, type=str(value.type))
    return g


def _vertex(g: nx.DiGraph, key: str, kind: str, name: str, value) -> str:
    g.add_node(key, kind=kind, op=kind, label=f"{kind} {name}\n{value.type}", types=str(value.type),
               outputs=name)
    return key


def _stages(manifest: Mapping[str, Any] | None) -> dict[int, int]:
    """Node index -> pipeline stage, from the manifest's stage ranges (ignored when malformed)."""
    parallel = (manifest or {}).get("parallel")
    stages = parallel.get("stages") if isinstance(parallel, dict) else None
    out: dict[int, int] = {}
    for entry in stages if isinstance(stages, list) else []:
        nodes = entry.get("nodes") if isinstance(entry, dict) else None
        if (isinstance(nodes, list) and len(nodes) == 2 and all(type(n) is int for n in nodes)
                and type(entry.get("stage")) is int):
            out.update(dict.fromkeys(range(max(nodes[0], 0), nodes[1]), entry["stage"]))
    return out


def _slots(manifest: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Value name -> memory slot attributes, from the manifest's memory plan (already checked
    against the graph by the caller)."""
    plan = (manifest or {}).get("memory_plan")
    if not isinstance(plan, dict):
        return {}
    out: dict[str, dict[str, Any]] = {}
    for b in plan.get("buffers", []):
        out[b["value"]] = {"memory_offset": b["offset"], "memory_bytes": b["size"]}
    for a in plan.get("aliases", []):
        root = out.get(a["root"], {})
        out[a["value"]] = {"memory_offset": root.get("memory_offset", 0) + a["offset"],
                           "memory_shares": f"{a['kind']} of %{a['root']}"}
    for name in plan.get("external", []):
        out[name] = {"memory_shares": "outside the arena"}
    return out


def to_dot(g: nx.DiGraph) -> str:
    """Graphviz DOT text: boxes for ops (filled by fusion group), ellipses for inputs, weights
    and outputs, one cluster per pipeline stage, edges labelled with the value's name."""
    lines = [f"digraph {_quote(g.graph.get('name', 'main'))} {{",
             '  node [shape=box, fontname="monospace", fontsize=10];',
             '  edge [fontname="monospace", fontsize=9];']
    by_stage: dict[Any, list[str]] = {}
    for key, data in g.nodes(data=True):
        by_stage.setdefault(data.get("stage"), []).append(_dot_vertex(key, data))
    for stage, vertices in sorted(by_stage.items(), key=lambda kv: (kv[0] is not None, kv[0])):
        if stage is None:
            lines += [f"  {v}" for v in vertices]
        else:
            lines.append(f"  subgraph cluster_stage{stage} {{")
            lines.append(f"    label={_quote(f'stage {stage}')};")
            lines += [f"    {v}" for v in vertices]
            lines.append("  }")
    for src, dst, data in g.edges(data=True):
        lines.append(f"  {_quote(src)} -> {_quote(dst)} [label={_quote('%' + data['value'])}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _dot_vertex(key: str, data: Mapping[str, Any]) -> str:
    attrs = {"label": data["label"]}
    if data["kind"] != "op":
        attrs["shape"] = "ellipse"
    if "fusion_group" in data:
        attrs["style"] = "filled"
        attrs["fillcolor"] = _PALETTE[data["fusion_group"] % len(_PALETTE)]
        attrs["label"] += f"\ngroup {data['fusion_group']}"
    if "memory_offset" in data:
        attrs["label"] += f"\n@{data['memory_offset']}"
    return f"{_quote(key)} [{', '.join(f'{k}={_quote(v)}' for k, v in attrs.items())}];"


def _quote(text: Any) -> str:
    escaped = str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def write_graph(path: str | Path, graph: Graph, manifest: Mapping[str, Any] | None = None,
                dot: str | None = None) -> Path:
    """Write the IR graph to `path`, in the format its suffix names. `dot` is the Graphviz
    executable for .svg (found on PATH when None)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise DayzeroError(f"--graph cannot write '{path.name}': unknown format {suffix!r}",
                           "--graph", f"name a file ending in one of {', '.join(FORMATS)}")
    g = ir_digraph(graph, manifest)
    if suffix == ".graphml":
        nx.write_graphml(g, path)
    elif suffix == ".svg":
        _render_svg(to_dot(g), path, dot or shutil.which("dot"))
    else:
        path.write_text(to_dot(g))
    return path


def _render_svg(text: str, path: Path, dot: str | None) -> None:
    if dot is None:
        raise DayzeroError("rendering SVG needs Graphviz's `dot`, which is not installed here",
                           "--graph", "install Graphviz (e.g. `apt install graphviz`), or write "
                           f"{path.with_suffix('.dot').name} and render it where Graphviz is")
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "graph.dot"
        source.write_text(text)
        result = subprocess.run([dot, "-Tsvg", "-o", str(path), str(source)],
                                capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise DayzeroError(f"Graphviz's dot failed to render {path.name}: "
                           f"{result.stderr.strip()[:500]}", dot,
                           "write .dot instead and check it with `dot -Tsvg`")
