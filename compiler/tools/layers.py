"""Which layer each node belongs to, from the weights it depends on, for per-layer error plots.

Transformer weights are named by module path with the layer index in it
(`model.layers.3.mlp.up_proj.weight`, `encoder.layer.0...`, `vision_tower...layers.1...`). A
weight's layer is its name up to the first numeric component; a node's layer is the latest
(in execution order) layer among everything it depends on, so a residual add after layer 3's MLP
is in layer 3 and the final norm is counted with the last layer. Nodes before any layer
(embeddings, masks) are in "input". Weights that fold_constants computed
(`folded.model_layers_3_...`) count for the layer they were computed from.
"""

from __future__ import annotations

import re

from compiler.ir import Graph

INPUT = "input"
_LAYER = re.compile(r"^(.*?\.\d+)\.")
# fold_constants names a weight it computes `folded.<source name with dots as underscores>`
_FOLDED = "folded."
_FOLDED_LAYER = re.compile(r"^(.*?_\d+)_")


def layer_of(weight: str) -> str | None:
    """The module path of the layer a weight belongs to, or None."""
    if weight.startswith(_FOLDED):
        match = _FOLDED_LAYER.match(weight[len(_FOLDED):])
        return match.group(1).replace("_", ".") if match else None
    match = _LAYER.match(weight)
    return match.group(1) if match else None


def layer_labels(graph: Graph) -> dict[str, str]:
    """Value name -> short layer label (unique suffix of the module path, e.g. `layers.3`)."""
    order: dict[str, int] = {}
    of_value: dict[int, str] = {}
    for name, value in graph.weights.items():
        layer = layer_of(name)
        if layer is not None:
            of_value[id(value)] = layer
    labels: dict[str, str] = {}
    for node in graph.nodes:
        found = [of_value[id(v)] for v in node.inputs if v is not None and id(v) in of_value]
        for label in found:
            order.setdefault(label, len(order))
        label = max(found, key=order.__getitem__) if found else None
        for value in node.outputs:
            if label is not None:
                of_value[id(value)] = label
            labels[value.name] = label or INPUT
    short = _shorten(list(order))
    return {name: short.get(label, label) for name, label in labels.items()}


def _shorten(paths: list[str]) -> dict[str, str]:
    """The fewest trailing dotted components that keep every path distinct."""
    for keep in range(2, 16):
        short = {p: ".".join(p.split(".")[-keep:]) for p in paths}
        if len(set(short.values())) == len(paths):
            return short
    return {p: p for p in paths}
