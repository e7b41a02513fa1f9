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
from .index_inputs import MANIFEST_KEY, IndexRange, find_index_inputs, index_inputs_json
from .memory_plan import check_memory_plan
from .specs import TensorSpec

_FIX = "the artifact is corrupted or was edited; recompile it"


def check_artifact_graph(artifact: Artifact, input_specs: Sequence[TensorSpec],
                         output_specs: Sequence[TensorSpec]) -> dict[str, IndexRange]:
    """Parse and verify graph.dzir, check the manifest against it; returns its index inputs."""
    manifest = artifact.manifest
    graph = parse_verified(artifact.graph_text(), f"{artifact.root}/{manifest['graph']}")
    check_specs(graph, input_specs, output_specs, f"{artifact.root}/manifest.json")
    found = find_index_inputs(graph)
    recorded = manifest.get(MANIFEST_KEY)
    if recorded is not None and recorded != index_inputs_json(graph):
        raise ArtifactError(f"manifest.json: {MANIFEST_KEY} {recorded!r} is not what graph.dzir "
                            f"gives ({index_inputs_json(graph)!r})",
                            f"{artifact.root}/manifest.json: {MANIFEST_KEY}", _FIX)
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
    for key, values, specs in (("inputs", graph.inputs, input_specs),
                               ("outputs", graph.outputs, output_specs)):
        want = [_spec(graph, v) for v in values]
        have = [(s.name, s.dtype, tuple(s.shape), dict(s.ranges)) for s in specs]
        if want != have:
            first = next((i for i, (w, h) in enumerate(zip(want, have)) if w != h),
                         min(len(want), len(have)))
            got = have[first] if first < len(have) else "nothing"
            exp = want[first] if first < len(want) else "nothing"
            raise ArtifactError(f"manifest.json {key}[{first}] is {got} but graph.dzir has "
                                f"{exp}", f"{where}: {key}", _FIX)


def _spec(graph: Graph, value) -> tuple:
    shape = tuple(d if isinstance(d, int) else symbolic.dim_str(d) for d in value.type.shape)
    used = sorted({s for d in value.type.shape for s in symbolic.free_symbols(d)})
    ranges = {s: tuple(graph.symbols[s]) for s in used if s in graph.symbols}
    return value.name, value.type.dtype.value, shape, ranges
