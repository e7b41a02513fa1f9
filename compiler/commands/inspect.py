"""`dayzero inspect ARTIFACT|FILE.dzir`: print the IR and what the artifact records."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import DayzeroError


def add_parser(sub) -> None:
    p = sub.add_parser("inspect", help="print an artifact's or a .dzir file's IR")
    p.add_argument("path", metavar="ARTIFACT|FILE.dzir")
    p.add_argument("--memory", action="store_true",
                   help="show the memory plan: peak, lower bound, naive total, values at peak")
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw the memory plan's arena over time to an image file")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--kernels", action="store_true",
                   help="print the Triton kernels generated for the graph (triton backend)")
    p.add_argument("--graph", metavar="FILE.graphml|FILE.dot|FILE.svg",
                   help="write the IR as a graph file (op, types, fusion group, pipeline stage "
                        "and memory slot as attributes); .svg needs Graphviz's dot")
    p.add_argument("--rank", type=int, metavar="N",
                   help="show rank N's graph of a partitioned artifact (default: the global one)")
    p.set_defaults(handler=inspect_command)


def inspect_command(args) -> int:
    from ..ir import parse_ir, print_ir

    path = Path(args.path)
    if path.is_file():
        graph = parse_ir(_ir_text(path), source=str(path))
        manifest = None
    elif path.is_dir():
        from runtime.artifact import open_artifact

        artifact = open_artifact(path)
        manifest = dict(artifact.manifest)
        # a partitioned artifact's graph.dzir is the annotated global graph, not rank 0's
        partitioned_graph = manifest.get("parallel", {}).get("world_size", 1) > 1
        text = artifact.global_graph_text() if partitioned_graph else artifact.graph_text()
        graph = parse_ir(text, source=str(path / (manifest["graph"] if partitioned_graph
                                                  else "graph.dzir")))
        if args.rank is not None:
            graph = parse_ir(artifact.graph_text(args.rank), source=f"{path} rank {args.rank}")
    else:
        raise DayzeroError(f"{path} does not exist", str(path),
                           "give an artifact directory or a .dzir file")
    if args.graph:
        return _graph_file(args, path, graph, manifest)
    if args.memory or args.plot:
        return _memory(args, path, graph, manifest)
    if args.kernels:
        return _kernels(args, graph)
    if args.rank is not None and manifest is None:
        raise DayzeroError("--rank needs a partitioned artifact, not a .dzir file", "--rank")
    from . import inspect_parallel as par

    partitioned = par.is_partitioned(manifest)
    report = par.report_for(par.rank_graphs(artifact) if partitioned else {0: graph})
    if args.json:
        print(json.dumps({"manifest": manifest, "graph": print_ir(graph),
                          "communication": report}, indent=2, default=str))
        return 0
    if manifest is not None:
        print(f"# artifact {path}: backend {manifest.get('backend')}, "
              f"format {manifest.get('format')} v{manifest.get('format_version')}")
        if manifest.get("pipeline"):
            print(f"# pipeline {manifest['pipeline']}")
        if manifest.get("symbols"):
            print(f"# size symbols (dayzero run --size NAME=N): {_symbols(manifest)}")
    if partitioned:
        print(par.comment(par.summary(manifest, report)), end="")
    elif report is not None:
        from passes.parallel.report import format_report

        print(par.comment(format_report(report)), end="")
    print(print_ir(graph), end="")
    if manifest is not None and not partitioned:
        _describe_backend(artifact)
    return 0


def _ir_text(path: Path) -> str:
    """The text of an IR file. A file that is not one (README.md, an artifact's manifest.json)
    is refused as such, not reported as a syntax error in its first line: a file named .dzir,
    or whose first line that is not a comment starts a graph, is taken as IR."""
    fix = (f"give the artifact directory {path.parent}, not its manifest"
           if path.name == "manifest.json" else "give an artifact directory (dayzero compile "
           "... -o NAME.dz writes one) or a .dzir file (dayzero compile --dump-ir DIR writes them)")
    neither = DayzeroError(f"{path} is neither an artifact nor a .dzir IR file", str(path), fix)
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        if path.suffix == ".dzir":
            raise DayzeroError(f"cannot read {path}: it is not UTF-8 text", str(path)) from None
        raise neither from None
    except OSError as exc:
        raise DayzeroError(f"cannot read {path}: {exc}", str(path)) from None
    first = next((line.strip() for line in text.splitlines()
                  if line.strip() and not line.lstrip().startswith("#")), "")
    if path.suffix != ".dzir" and not first.startswith("graph "):
        raise neither
    return text


def _symbols(manifest: dict) -> str:
    """`s0 (seq) in [2, 512]`: each size symbol, the Dim names that alias it, its range."""
    aliases = manifest.get("symbol_aliases")
    aliases = aliases if isinstance(aliases, dict) else {}
    parts = []
    for name, bounds in manifest["symbols"].items():
        names = "/".join(alias for alias, sym in aliases.items() if sym == name)
        lo, hi = bounds if isinstance(bounds, list) and len(bounds) == 2 else ("?", "?")
        shown = f"{name} ({names})" if names else name
        parts.append(f"{shown} in [{lo}, {'unbounded' if hi is None else hi}]")
    return ", ".join(parts)


def _describe_backend(artifact) -> None:
    """The backend's own account of the lowering (e.g. IR node -> ONNX ops), as comments."""
    import backends

    text = backends.get(artifact.manifest["backend"]).describe(artifact)
    if text:
        print(f"# lowering by {artifact.manifest['backend']}:")
        print("".join(f"#   {line}\n" for line in text.splitlines()), end="")


def _graph_file(args, path: Path, graph, manifest: dict | None) -> int:
    """--graph: the IR with the plan data that describes this graph's nodes (the stages of a
    partitioned artifact's global graph, the memory plan of an unpartitioned one, checked)."""
    from runtime.memory_plan import check_memory_plan

    from .inspect_graph import write_graph

    context: dict = {}
    if manifest is not None and args.rank is None:
        if manifest.get("parallel", {}).get("world_size", 1) > 1:
            context["parallel"] = manifest["parallel"]
        elif manifest.get("memory_plan") is not None:
            check_memory_plan(manifest["memory_plan"], graph, f"{path}/manifest.json: memory_plan")
            context["memory_plan"] = manifest["memory_plan"]
    out = write_graph(args.graph, graph, context)
    print(f"wrote {out} ({len(graph.nodes)} nodes)")
    return 0


def _kernels(args, graph) -> int:
    """The generated kernel sources, regenerated from the graph exactly as the backend does."""
    from backends.triton import kernel_sources

    sources = kernel_sources(graph)
    if args.json:
        print(json.dumps(sources, indent=2))
    else:
        for name, source in sources.items():
            print(f"# kernel {name}\n{source}")
    return 0


def _memory(args, path: Path, graph, manifest: dict | None) -> int:
    """--memory / --plot: the recorded plan (checked against the graph), or one computed now."""
    from passes.memory import MemoryPlan, plan_graph, verify_plan
    from passes.memory.report import summarize

    recorded = manifest is not None and manifest.get("memory_plan") is not None
    generation = (manifest or {}).get("generation")
    if generation is not None and not recorded:
        from .generation_memory import step_sizes

        plan = plan_graph(graph, step_sizes(manifest, graph))
    elif recorded:
        plan = MemoryPlan.from_json(manifest["memory_plan"], f"{path}/manifest.json: memory_plan")
        verify_plan(plan, graph)
    else:
        plan = plan_graph(graph)
    if args.plot:
        from passes.memory.plot import plot_plan

        plot_plan(plan, args.plot, title=f"{graph.name} ({path.name})")
    if args.json:
        print(json.dumps({"memory_plan": plan.to_json(), "recorded": recorded}, indent=2))
    elif args.memory:
        if generation is not None:
            from .generation_memory import memory_by_kind

            print(memory_by_kind(manifest, graph, plan.arena_bytes), end="")
        print(summarize(plan, graph, recorded), end="")
    if args.plot and not args.json:
        print(f"wrote {args.plot}")
    return 0
