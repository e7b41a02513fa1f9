"""Named analyses: results computed from a graph, cached on it until it changes.

An analysis is a registered pure function `compute(graph, **options) -> result` (the memory plan,
the sharding of every value, the position tables a backend can precompute). `graph.analysis(name,
**options)` returns the cached result while the graph is unchanged and recomputes it after a
mutation, so a pass and the driver that both need the memory plan share one computation, and
nothing travels beside the graph as hidden state (LLVM's AnalysisManager, MLIR's
`getAnalysis<T>()`).

Invalidation is by version: every mutation method of `Graph` bumps `graph.version`, and a cached
result is current only at the version it was computed at. Passes that edit nodes directly
(`node.inputs = ...`, `graph.nodes = ...`) are covered by the pass manager, which calls
`mark_changed` after every pass that reports a change; a pass that keeps an analysis valid across
its own edits names it in `Pass.preserves`. Edits of `graph.symbols` or `graph.weight_data` outside
a pass are not seen: change them before asking, or call `mark_changed`.

`describe(graph)` prints the current results as `#` comment lines (the .dzir parser skips them),
which is how `--dump-ir` files show them after the graph.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .graph import Graph

Compute = Callable[..., Any]  # (graph, **options) -> result
Describe = Callable[["Graph", Any], list[str]]  # (graph, result) -> lines, without "#"


@dataclass(frozen=True)
class AnalysisDef:
    """One named analysis: how to compute it and how to print a result of it."""

    name: str
    summary: str
    compute: Compute
    describe: Describe


ANALYSES: dict[str, AnalysisDef] = {}
"""Analysis name -> its definition; filled by `register_analysis` where each analysis lives."""


def register_analysis(name: str, summary: str,
                      describe: Describe | None = None) -> Callable[[Compute], Compute]:
    """Decorator registering `compute(graph, **options)` as the analysis `name`."""
    def register(compute: Compute) -> Compute:
        ANALYSES[name] = AnalysisDef(name, summary, compute, describe or _describe_repr)
        return compute
    return register


def _describe_repr(graph: Graph, result: Any) -> list[str]:
    return [repr(result)]


def cached(graph: Graph, name: str, options: Mapping[str, Any]) -> Any:
    """The result of analysis `name` with `options` for `graph`, computed once per version."""
    definition = ANALYSES.get(name)
    if definition is None:
        raise KeyError(f"no analysis named {name!r}; registered: {', '.join(sorted(ANALYSES))} "
                       "(an analysis is registered when the module defining it is imported)")
    key = (name, tuple(sorted(options.items())))
    entry = graph.analysis_cache.get(key)
    if entry is not None and entry[0] == graph.version:
        return entry[1]
    version = graph.version
    result = definition.compute(graph, **options)
    graph.analysis_cache[key] = (version, result)
    return result


def current(graph: Graph) -> list[tuple[str, tuple[tuple[str, Any], ...], Any]]:
    """(name, options, result) of every cached result still valid for `graph`, by name."""
    return sorted(((name, options, result)
                   for (name, options), (version, result) in graph.analysis_cache.items()
                   if version == graph.version), key=lambda e: (e[0], _shown(e[1])))


def mark_changed(graph: Graph, preserve: Iterable[str] = (), since: int | None = None) -> None:
    """Record a change the mutation methods did not see: every cached result goes stale, except
    those of the analyses in `preserve` computed at version `since` or later (the caller, a pass
    that started at `since`, vouches that they still hold)."""
    preserve = set(preserve)
    graph.version += 1
    for key, (version, result) in list(graph.analysis_cache.items()):
        if key[0] in preserve and since is not None and version >= since:
            graph.analysis_cache[key] = (graph.version, result)
        elif version != graph.version:
            del graph.analysis_cache[key]


def describe(graph: Graph) -> str:
    """The current results as a comment block: `# analysis NAME{options}:` and indented lines
    (a result that describes itself in no lines, such as no masks to prove, is left out)."""
    lines = []
    for name, options, result in current(graph):
        described = ANALYSES[name].describe(graph, result)
        if not described:
            continue
        shown = _shown(options)
        lines.append(f"analysis {name}" + (f"{{{shown}}}" if shown else "") + ":")
        lines += [f"  {line}" for line in described]
    return "".join(f"# {part}\n" for line in lines for part in line.splitlines() or [""])


def _shown(options: tuple[tuple[str, Any], ...]) -> str:
    """Options as a pass pipeline writes them: `alignment=64,inplace=true`."""
    return ",".join(f"{k}={_format(v)}" for k, v in options)


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
