"""The compile driver: export → passes → lower → write, the one path every entry point takes."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .config import CompileConfig, load_config
from .errors import DayzeroError
from .ir import Graph
from .log import SILENT, StageLog


def compile(model, example_inputs: tuple, out: str | Path = "model.dz",
            backend: str = "onnxruntime", dynamic_shapes: Any = None,
            config: Mapping[str, Any] | str | Path | None = None, *, passes: str | None = None,
            dump_ir: str | Path | None = None, force: bool = False,
            log: StageLog | None = None) -> Path:
    """Compile `model` into an artifact directory at `out` and return its path.

    `passes` (a pipeline string) overrides the config's `passes:`; `dump_ir` writes the IR after
    every pass; `force` replaces an existing artifact (only once the new one is complete).
    """
    from .frontend import export

    log = log or SILENT
    cfg = load_config(config)
    _refuse_unimplemented(cfg)
    target = _backend(backend)
    out = Path(out)
    if out.exists() and not force:
        raise DayzeroError(f"output path {out} already exists", str(out),
                           "choose another path or pass --force (force=True) to replace it")
    with log.stage("export"):
        graph = export(model, example_inputs, dynamic_shapes=dynamic_shapes)
        log.line(f"  {len(graph.nodes)} nodes, {len(graph.weights)} weights")
    return lower_and_write(graph, out, target, cfg, passes=passes, dump_ir=dump_ir, force=force,
                           log=log)


def lower_and_write(graph: Graph, out: Path, target, cfg: CompileConfig, *,
                    passes: str | None, dump_ir, force: bool, log: StageLog) -> Path:
    """Run the pipeline on an exported graph and write the artifact for `target`."""
    from passes import DEFAULT_PIPELINE, PassManager, format_pipeline, parse_pipeline
    from runtime.artifact import write_artifact

    pipeline = parse_pipeline(passes or (",".join(cfg.passes) if cfg.passes else DEFAULT_PIPELINE))
    manager = PassManager(pipeline, dump_dir=dump_ir, log=log.line)
    with log.stage("passes", format_pipeline(pipeline)):
        graph = manager.run(graph)
    _check_supported(graph, target)
    with log.stage("lower+write", f"backend {target.name} -> {out}"):
        total = sum(int(getattr(t, "nbytes", 0)) for t in graph.weight_data.values())
        path = write_artifact(out, graph, target, options={}, force=force,
                              manifest_extra={"pipeline": format_pipeline(pipeline),
                                              "config": {"parallel": cfg.parallel,
                                                         "precision": cfg.precision,
                                                         "quantize": cfg.quantize}},
                              progress=log.progress(total, "weights"))
    log.line(f"wrote {path}")
    return path


def _backend(name: str):
    import backends

    return backends.get(name)


def _check_supported(graph: Graph, target) -> None:
    missing: dict[str, list] = {}
    for node in graph.nodes:
        if not target.supports(node):
            missing.setdefault(node.op, []).append(node)
    if missing:
        lines = [f"{op} ({len(nodes)}x, first at {nodes[0].loc or 'unknown location'})"
                 for op, nodes in sorted(missing.items())]
        raise DayzeroError(f"backend '{target.name}' does not support: " + "; ".join(lines),
                           f"backend {target.name}",
                           "choose another backend (dayzero backends lists them)")


def _refuse_unimplemented(cfg: CompileConfig) -> None:
    """Valid config values this version cannot honour yet are refused, never ignored."""
    defaults = {"parallel": 1, "precision": "fp32", "quantize": None}
    for section in ("parallel", "precision", "quantize"):
        for key, value in cfg.section(section).items():
            if key == "group_size":
                continue
            if value != defaults[section]:
                raise DayzeroError(f"config key '{section}.{key}: {value}' is valid but not "
                                   "supported by this version yet", cfg.source,
                                   f"remove '{section}.{key}' or set it to its default")
