"""The manifest against graph.dzir at load: an artifact is trusted only as far as it agrees.

manifest.json holds every other file's hash, so it is the one file an edit can change without
a hash noticing; input validation trusts its specs and index ranges, and output checks its
output shapes. A manifest-only edit of `index_inputs.input_ids.lo` to -256 let token id -1
through (ONNX Runtime's Gather read row 255); an edited output shape ended in an
OutputShapeError blaming the lowering. So at load every such field is compared with the graph
the artifact was compiled to: the input and output specs (names, dtypes, dims, the ranges of
their symbols), every declared symbol, and the index ranges the graph's table lookups give.

Backends that execute graph.dzir have it parsed and verified (`runtime.graph_checks`, which
uses the comparisons here); for the others it is read by `runtime.graph_summary`, linearly and
without the IR parser.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from compiler.errors import ArtifactError

from .dims import dim_symbols
from .graph_summary import GraphSummary, SummaryValue, summarize
from .index_inputs import MANIFEST_KEY, IndexRange, find_index_inputs, index_inputs_json
from .specs import TensorSpec

FIX = "recompile the artifact: it was edited or corrupted after it was written"
INCONSISTENT = "the artifact is inconsistent:"

SpecTuple = tuple[str, str, tuple, dict]


def check_against_graph_text(artifact, input_specs: Sequence[TensorSpec],
                             output_specs: Sequence[TensorSpec]) -> dict[str, IndexRange]:
    """The manifest's specs, symbols and index ranges against the artifact's graph (the
    manifest's `graph`, which they describe); returns the graph's index ranges."""
    manifest = artifact.manifest
    summary = summarize(artifact.global_graph_text(), f"{artifact.root}/{manifest['graph']}")
    where = f"{artifact.root}/manifest.json"
    compare_specs([_spec(summary, v) for v in summary.inputs],
                  [_spec(summary, v) for v in summary.outputs], input_specs, output_specs, where)
    compare_symbols(manifest.get("symbols", {}), summary.symbols, where)
    compare_index_inputs(manifest.get(MANIFEST_KEY), index_inputs_json(summary), where)
    return find_index_inputs(summary)


def compare_specs(graph_inputs: Sequence[SpecTuple], graph_outputs: Sequence[SpecTuple],
                  input_specs: Sequence[TensorSpec], output_specs: Sequence[TensorSpec],
                  where: str) -> None:
    """Inputs and outputs as (name, dtype, dims, ranges of their symbols), in order."""
    for key, want, specs in (("inputs", graph_inputs, input_specs),
                             ("outputs", graph_outputs, output_specs)):
        have = [(s.name, s.dtype, tuple(s.shape), dict(s.ranges)) for s in specs]
        want = list(want)
        if want != have:
            first = next((i for i, (w, h) in enumerate(zip(want, have)) if w != h),
                         min(len(want), len(have)))
            got = have[first] if first < len(have) else "nothing"
            exp = want[first] if first < len(want) else "nothing"
            raise ArtifactError(f"{INCONSISTENT} manifest.json {key}[{first}] is {got} but "
                                f"graph.dzir has {exp}", f"{where}: {key}[{first}]", FIX)


def compare_symbols(recorded: Any, graph: Mapping[str, tuple[int, int | None]],
                    where: str) -> None:
    """Every size symbol and its range, as declared by the graph (one no spec uses still
    bounds a dim inside the graph)."""
    have = {name: tuple(bounds) for name, bounds in recorded.items()}
    want = {name: tuple(bounds) for name, bounds in graph.items()}
    if have != want:
        name = next(n for n in sorted(set(have) | set(want)) if have.get(n) != want.get(n))
        raise ArtifactError(f"{INCONSISTENT} manifest.json symbols.{name} is "
                            f"{_range(have.get(name))} but graph.dzir declares "
                            f"{_range(want.get(name))}", f"{where}: symbols.{name}", FIX)


def compare_index_inputs(recorded: Any, graph: Mapping[str, Any], where: str) -> None:
    """The recorded index ranges are the graph's (none recorded: an older artifact, whose
    ranges come from the graph)."""
    if recorded is not None and recorded != graph:
        raise ArtifactError(f"{INCONSISTENT} manifest.json: {MANIFEST_KEY} {_short(recorded)} "
                            f"is not what graph.dzir gives ({_short(graph)})",
                            f"{where}: {MANIFEST_KEY}", FIX)


def _spec(summary: GraphSummary, value: SummaryValue) -> SpecTuple:
    used = sorted({s for d in value.type.shape if isinstance(d, str) for s in dim_symbols(d)})
    ranges = {s: tuple(summary.symbols[s]) for s in used if s in summary.symbols}
    return value.name, value.type.dtype.value, tuple(value.type.shape), ranges


def _range(bounds: tuple | None) -> str:
    return "undeclared" if bounds is None else f"[{bounds[0]}, {bounds[1]}]"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 300 else text[:297] + "..."
