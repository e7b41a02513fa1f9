"""The layering of dayzero's packages, written down as data in one place.

Data flows one way: IR core -> frontend -> passes -> backends' lowering -> artifact writing ->
driver and CLI; the runtime (reading, validating and running an artifact) stands on the artifact
format and the backends' executors only. `FLOORS` lists the layers bottom to top; each layer
names the module prefixes it holds and the layers it `uses`. A module may import a module of its
own layer, or of a layer its layer reaches through `uses` (directly or through the layers those
use), never anything else: a layer that is not reachable is off limits even when it sits on a
lower floor (the runtime never imports the passes, a backend never imports another backend).

`tests/test_layering.py` reads every import of the packages (function-level ones included) and
fails on an edge this data does not allow. `python -m compiler.layering` prints the layer diagram,
`--update docs/architecture.md` rewrites the doc's copy of it, `--check` lists forbidden imports.

Only the standard library is imported here (networkx where graphs are built), so the check runs
without torch.
"""

from __future__ import annotations

import ast
import functools
import sys
import textwrap
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("compiler", "passes", "backends", "runtime", "dayzero")


@dataclass(frozen=True)
class Layer:
    """A named group of modules (by dotted prefix) and the layers its modules may import."""

    name: str
    modules: tuple[str, ...]
    uses: tuple[str, ...]
    summary: str


@dataclass(frozen=True)
class Floor:
    """Layers at one height of the data flow; every `uses` edge points to a lower floor."""

    name: str
    layers: tuple[Layer, ...]


_BACKENDS = ("reference backend", "onnxruntime backend", "triton backend")

FLOORS: tuple[Floor, ...] = (
    Floor("foundation", (
        Layer("errors", ("compiler.errors", "compiler.log", "compiler.heap"), (),
              "DayzeroError (what, where, fix), stage logging, the C heap's trim"),
    )),
    Floor("IR core", (
        Layer("ir", ("compiler.ir",), ("errors",),
              "Graph/Node/Value, op table, .dzir text, verifier, weight storage protocol"),
    )),
    Floor("frontend", (
        Layer("frontend", ("compiler.frontend",), ("ir",),
              "torch.export program -> IR"),
    )),
    Floor("pass framework", (
        Layer("pass framework", ("passes.base", "passes.registry", "passes.pipeline",
                                 "passes.manager"), ("ir",),
              "Pass contract, registry, pipeline strings, pass manager"),
    )),
    Floor("pass building blocks", (
        Layer("rewrite engine", ("passes.rewrite",), ("ir",),
              "patterns, rules, the rewrite driver"),
        Layer("analyses", ("passes.index_expressions", "passes.mask_transfers",
                           "passes.memory"), ("ir",),
              "index expressions, mask transfer functions, memory planning"),
    )),
    Floor("pattern sets", (
        Layer("fusion rules", ("passes.fusion",), ("rewrite engine",),
              "fusion pattern sets and fusion groups"),
    )),
    Floor("passes", (
        Layer("registered passes", (
            "passes.decompose_fused", "passes.derive_generation_step",
            "passes.eliminate_common_subexpressions",
            "passes.eliminate_dead_code", "passes.fold_constants", "passes.fuse",
            "passes.fuse_groups", "passes.plan_memory", "passes.precision",
            "passes.quantize_experts", "passes.quantize_weights",
            "passes.recognize_causal_masks", "passes.remove_noops",
            "passes.schedule_for_memory", "passes.parallel"),
              ("pass framework", "fusion rules", "analyses"),
              "one registered pass per module; parallel/ shards and partitions"),
    )),
    Floor("pass catalogue", (
        Layer("pass catalogue", ("passes.__init__",), ("registered passes",),
              "`import passes`: every built-in pass registered"),
    )),
    Floor("backend interface", (
        Layer("backend interface", ("backends.__init__", "backends.base", "backends.registry",
                                    "backends.user_cache",
                                    "backends.capability_partition"), ("ir",),
              "Backend, Capabilities, registry, capability tagging, per-user cache folder"),
    )),
    Floor("backends", tuple(
        Layer(name, (f"backends.{name.split()[0]}",), ("backend interface",), summary)
        for name, summary in zip(_BACKENDS, ("torch eager, op by op: the golden model",
                                             "IR -> ONNX, run by ONNX Runtime",
                                             "generated Triton kernels")))),
    Floor("runtime", (
        Layer("runtime", ("runtime",), ("backend interface",),
              "artifact reading, validation, execution, multi-rank execution"),
    )),
    Floor("artifact writing", (
        Layer("artifact writer", ("compiler.writer",), ("runtime",),
              "lowers through a backend and writes the artifact atomically"),
    )),
    Floor("configuration", (
        Layer("config", ("compiler.config",), ("backend interface", "runtime"),
              "the YAML config, checked"),
    )),
    Floor("driver", (
        Layer("driver", ("compiler.driver", "compiler.generation", "compiler.image_text",
                         "compiler.static_sizes"),
              ("config", "frontend", "pass catalogue", "artifact writer"),
              "compile(): export -> passes -> lower -> write"),
    )),
    Floor("driver clients", (
        Layer("checkpoint", ("compiler.checkpoint",), ("driver",),
              "Hugging Face checkpoint folders, streamed lazily"),
        Layer("torch.compile backend", ("compiler.torch_compile",), ("driver",),
              "torch.compile(backend='dayzero'): dynamo's graphs through the driver, cached"),
        Layer("tools", ("compiler.tools",), ("driver", "reference backend"),
              "coverage and layer-by-layer alignment"),
    )),
    Floor("specs", (
        Layer("spec", ("compiler.spec", "compiler.hf_models"), ("checkpoint",),
              "SPEC arguments: file.py:function or a checkpoint folder"),
    )),
    Floor("CLI", (
        Layer("cli", ("compiler.cli", "compiler.commands"), ("spec", "tools", *_BACKENDS),
              "dayzero subcommands"),
    )),
    Floor("facades", (
        Layer("facades", ("compiler.__init__", "dayzero", "compiler.layering"), ("cli",),
              "`import compiler`, `import dayzero`: the public API in one namespace"),
    )),
)

LAYERS: dict[str, Layer] = {layer.name: layer for floor in FLOORS for layer in floor.layers}
FLOOR_OF: dict[str, int] = {layer.name: i for i, floor in enumerate(FLOORS)
                            for layer in floor.layers}
_PATTERNS: dict[str, str] = {p: layer.name for layer in LAYERS.values() for p in layer.modules}


def pattern_of(module: str) -> str | None:
    """The longest module prefix in the data that holds `module` (None: no layer holds it).

    `pkg.__init__` stands for a package's own `__init__.py` alone, not for its submodules.
    """
    if f"{module}.__init__" in _PATTERNS:
        return f"{module}.__init__"
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in _PATTERNS:
            return prefix
    return None


def layer_of(module: str) -> str | None:
    pattern = pattern_of(module)
    return None if pattern is None else _PATTERNS[pattern]


def allowed_graph():
    """The layers as a networkx DiGraph with an edge per `uses` entry."""
    import networkx as nx

    graph = nx.DiGraph()
    graph.add_nodes_from(LAYERS)
    graph.add_edges_from((layer.name, used) for layer in LAYERS.values() for used in layer.uses)
    return graph


def reachable() -> dict[str, frozenset[str]]:
    """Layer -> the layers its modules may import (itself and all it reaches through `uses`)."""
    import networkx as nx

    graph = allowed_graph()
    return {name: frozenset({name, *nx.descendants(graph, name)}) for name in LAYERS}


# -- reading the imports of the source tree -----------------------------------------------------

@dataclass(frozen=True)
class Import:
    """One import statement's target, resolved to an absolute module name."""

    source: str  # importing module
    target: str  # imported module (or the package an imported name comes from)
    path: str  # file, relative to the root
    line: int
    function_level: bool


def modules(root: Path) -> dict[str, Path]:
    """Module name -> file, for every .py file of the packages under `root`."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(root: Path) -> tuple[Import, ...]:
    """Every import of a first-party module in the packages, module-level or not (read once
    per root: the test functions share it)."""
    return _imports(Path(root).resolve())


@functools.lru_cache(maxsize=4)
def _imports(root: Path) -> tuple[Import, ...]:
    return tuple(_read_imports(root))


def _read_imports(root: Path) -> Iterator[Import]:
    known = modules(root)
    for module, path in known.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        rel = str(path.relative_to(root))
        for node, nested in _walk(tree, False):
            for target in _targets(node, package, known):
                if target.split(".")[0] in PACKAGES:
                    yield Import(module, target, rel, node.lineno, nested)


def _walk(node: ast.AST, nested: bool) -> Iterator[tuple[ast.AST, bool]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, nested
        inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        yield from _walk(child, inner)


def _targets(node: ast.AST, package: str, known: dict[str, Path]) -> Iterable[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    # `from pkg import name`: the submodule when `name` is one, else the package itself
    return sorted({f"{module}.{a.name}" if f"{module}.{a.name}" in known else module
                   for a in node.names})


def unplaced(root: Path) -> list[str]:
    """Modules that no layer holds: a new module must be given its floor."""
    return sorted(module for module in modules(root) if pattern_of(module) is None)


def violations(root: Path) -> list[str]:
    """`file:line: a -> b (layer A may not import layer B)` for every import the data forbids."""
    may = reachable()
    bad = []
    for imp in imports(root):
        source, target = layer_of(imp.source), layer_of(imp.target)
        if source is None or target is None:
            bad.append(f"{imp.path}:{imp.line}: {imp.source} -> {imp.target}: module in no layer")
        elif target not in may[source]:
            bad.append(f"{imp.path}:{imp.line}: {imp.source} -> {imp.target} "
                       f"(layer '{source}' may not import layer '{target}')")
    return bad


def unit_graph(root: Path):
    """Sub-package import graph (networkx DiGraph): one node per module prefix of the data,
    an edge per import between two of them, carrying the first file:line that makes it."""
    import networkx as nx

    graph = nx.DiGraph()
    for imp in imports(root):
        a, b = pattern_of(imp.source), pattern_of(imp.target)
        if a and b and a != b and not graph.has_edge(a, b):
            graph.add_edge(a, b, where=f"{imp.path}:{imp.line}")
    return graph


# -- the diagram --------------------------------------------------------------------------------

def markdown() -> str:
    """The layer diagram for docs/architecture.md, top floor first."""
    lines = ["```"]
    for index in range(len(FLOORS) - 1, -1, -1):
        floor = FLOORS[index]
        lines.append(f"{index:>2} {floor.name}")
        for layer in floor.layers:
            lines += textwrap.wrap(f"{layer.name}: {', '.join(layer.modules)}", 96,
                                   initial_indent="   ", subsequent_indent="       ")
            lines.append(f"       {layer.summary}")
            if layer.uses:
                lines += textwrap.wrap(f"uses: {', '.join(layer.uses)}", 96,
                                       initial_indent="       ", subsequent_indent="         ")
    lines.append("```")
    return "\n".join(lines) + "\n"


BEGIN, END = "<!-- layers: generated by python -m compiler.layering -->", "<!-- layers end -->"


def with_diagram(doc: str) -> str:
    """`doc` with the text between the BEGIN and END markers replaced by `markdown()`."""
    head, _, rest = doc.partition(BEGIN + "\n")
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{markdown()}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    """No arguments: print the diagram; `--check`: list forbidden imports; `--update DOC`:
    rewrite the diagram between the markers of DOC (docs/architecture.md)."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["--check"]:
        bad = violations(Path(__file__).resolve().parent.parent)
        print("\n".join(bad) or "no import against the layering")
        return 1 if bad else 0
    if len(args) == 2 and args[0] == "--update":
        path = Path(args[1])
        path.write_text(with_diagram(path.read_text()))
        return 0
    print(markdown(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
