"""Load-time checks of what a single-rank artifact's executor will trust: graph.dzir verifies,
the manifest's input/output specs and index ranges are the graph's, and the memory plan is sound.

The manifest is not hashed (it holds the hashes) and graph.dzir can be re-hashed after an edit, so
only checking them protects a run: a spec that disagrees with the graph lets inputs through that
the executor was never built for; a plan that overlaps live buffers gives silently wrong outputs.
"""

from __future__ import annotations

from collections.abc import Sequence

from compiler.errors import ArtifactError, IRParseError, VerificationError
from compiler.ir import Graph, parse_ir, symbolic, verify

from .artifact import Artifact
from .consistency import compare_index_inputs, compare_specs, compare_symbols
from .index_inputs import MANIFEST_KEY, IndexRange, find_index_inputs, index_inputs_json
from .memory_plan import check_memory_plan
from .specs import TensorSpec

_FIX = "the artifact is corrupted or was edited; recompile it"


def check_artifact_graph(artifact: Artifact, input_specs: Sequence[TensorSpec],
                         output_specs: Sequence[TensorSpec]) -> dict[str, IndexRange]:
    """Parse and verify graph.dzir, check the manifest against it; returns its index inputs."""
    manifest = artifact.manifest
    graph = parse_verified(artifact.graph_text(), f"{artifact.root}/{manifest['graph']}")
    where = f"{artifact.root}/manifest.json"
    check_specs(graph, input_specs, output_specs, where)
    compare_symbols(manifest.get("symbols", {}), graph.symbols, where)
    found = find_index_inputs(graph)
    compare_index_inputs(manifest.get(MANIFEST_KEY), index_inputs_json(graph), where)
    plan = manifest.get("memory_plan")
    if plan is not None:
        check_memory_plan(plan, graph, f"{artifact.root}/manifest.json: memory_plan")
    return found


def parse_verified(text: str, path: str) -> Graph:
    """The graph of a .dzir text from an artifact, verified; ArtifactError naming `path`."""
    try:
        graph = parse_ir(text, source=path)
        verify(graph)
    except (IRParseError, VerificationError) as exc:
        where = exc.where if exc.where and path in exc.where else \
            f"{path}: {exc.where}" if exc.where else path
        name = path.rsplit("/", 1)[-1]
        raise ArtifactError(f"{name} does not verify: {exc.what}", where, _FIX) from None
    return graph


def check_specs(graph: Graph, input_specs: Sequence[TensorSpec],
                output_specs: Sequence[TensorSpec], where: str) -> None:
    """The manifest's inputs and outputs are the graph's: names, dtypes, shapes, symbol ranges."""
    compare_specs([_spec(graph, v) for v in graph.inputs],
                  [_spec(graph, v) for v in graph.outputs], input_specs, output_specs, where)


def _spec(graph: Graph, value) -> tuple:
    shape = tuple(d if isinstance(d, int) else symbolic.dim_str(d) for d in value.type.shape)
    used = sorted({s for d in value.type.shape for s in symbolic.free_symbols(d)})
    ranges = {s: tuple(graph.symbols[s]) for s in used if s in graph.symbols}
    return value.name, value.type.dtype.value, shape, ranges
