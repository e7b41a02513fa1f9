"""The compile driver: export → passes → lower → write, the one path every entry point takes."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import CompileConfig, load_config
from .errors import DayzeroError
from .ir import Graph, symbolic
from .ir.ops.collective import COMMUNICATION_OPS
from .log import SILENT, StageLog

if TYPE_CHECKING:
    from .frontend.refine import RefineState


def compile(model, example_inputs: tuple, out: str | Path = "model.dz",
            backend: str = "onnxruntime", dynamic_shapes: Any = None,
            config: Mapping[str, Any] | str | Path | None = None, *, passes: str | None = None,
            dump_ir: str | Path | None = None, force: bool = False,
            log: StageLog | None = None, checkpoint: Any = None,
            fallback: str | None = None, report: Callable[[str], None] | None = None,
            backend_options: Mapping[str, Any] | None = None, task: str = "forward",
            tokenizer: str | Path | None = None, static_sizes: Sequence[int] | None = None,
            _bundle: tuple[dict[str, bytes], dict[str, Any]] | None = None) -> Path:
    """Compile `model` into an artifact directory at `out` and return its path.

    `passes` (a pipeline string) overrides the config's `passes:`; `dump_ir` writes the IR after
    every pass; `force` replaces an existing artifact (only once the new one is complete).
    `checkpoint` (a `compiler.checkpoint.Checkpoint`, whose meta model `model` is) binds the
    exported graph's weights to the checkpoint's shards, streamed into the artifact.
    `fallback` names a backend for the nodes `backend` does not support (the backend must
    accept a `fallback` option, as triton does: it partitions by capabilities).
    `report` receives the fusion report (op counts before and after, patterns that fired).
    `backend_options` ({backend name: options}) is merged over the config's `backend_options:`.
    `task="text-generation"` compiles a causal LM (input_ids -> logits) into a generation
    artifact: a KV-cached step over a paged cache (compiler/generation.py); it carries the
    tokenizer of the folder `tokenizer` (default: the checkpoint folder), when it has one.
    Dynamic shapes torch.export refuses are retried with torch's suggested ranges and relations
    (the log and the manifest's `export_refinements` say what was compiled); a dim the model
    fixes to a constant is compiled at `static_sizes` (default: the example's size and its
    nearest powers of two) into one artifact whose runtime model picks the size that fits
    (compiler/static_sizes.py).
    """
    from .frontend import export
    from .frontend.refine import RefineState, SpecializedDims
    from .generation import (
        check_generation_config,
        check_task,
        eos_token_ids,
        generation_inputs,
        tokenizer_files,
        tokenizer_vocabulary_warning,
    )

    log = log or SILENT
    check_task(task)
    cfg = load_config(config).with_backend_options(backend_options)
    _refuse_unimplemented(cfg)
    eos, vision, vision_files = None, None, {}
    if task == "text-generation":
        from .generation import check_parallel

        check_parallel(cfg.parallel)
        eos = eos_token_ids(model)
        if tokenizer is None and checkpoint is not None:
            tokenizer = checkpoint.layout.root
        short = tokenizer_vocabulary_warning(tokenizer, model) if tokenizer else None
        if short:  # before the minutes of export
            log.line(f"  warning: {short}")
        from .image_text import is_image_text, prepare

        if is_image_text(model):  # vision encoder compiled now, the language step below
            if _world_size(cfg) > 1:
                raise DayzeroError("a partitioned image-text generation artifact is not "
                                   "supported yet", "parallel",
                                   "compile the image-text model for one device")
            _check_destinations(Path(out), force, dump_ir)
            model, example_inputs, dynamic_shapes, vision_files, vision = prepare(
                compile, model, example_inputs, dynamic_shapes, backend=backend, config=config,
                checkpoint=checkpoint, log=log, folder=tokenizer)
        example_inputs, dynamic_shapes = generation_inputs(example_inputs, dynamic_shapes)
    files = {**(tokenizer_files(tokenizer) if eos is not None else {}), **vision_files}
    if eos is not None and tokenizer is not None:
        check_generation_config(files, model, tokenizer, eos)
    target = _backend(backend)
    out = Path(out)
    _check_destinations(out, force, dump_ir)  # before the minutes of export and passes
    refined, specialized, refinements = RefineState(), None, None
    with log.stage("export"):
        try:
            graph = export(model, example_inputs, dynamic_shapes=dynamic_shapes, refined=refined)
        except SpecializedDims as exc:
            if _bundle is not None or checkpoint is not None or eos is not None \
                    or len(exc.sizes) != 1:
                raise
            specialized = exc
        else:
            log.line(f"  {len(graph.nodes)} nodes, {len(graph.weights)} weights")
            aliases = symbol_aliases(graph, refined_shapes(dynamic_shapes, refined))
            if aliases:
                log.line("  size symbols: " + ", ".join(f"{sym} ({name})"
                                                        for name, sym in aliases.items()))
            if refined.refinements:
                refinements = _log_refinements(graph, refined, aliases, log)
            if refined.grouped_experts:
                log.line(_grouped_experts_line(refined.grouped_experts))
    if specialized is not None:
        from .static_sizes import compile_sizes

        return compile_sizes(compile, model, example_inputs, dynamic_shapes, specialized, out,
                             static_sizes, log, backend=backend, config=config, passes=passes,
                             force=force, fallback=fallback, report=report,
                             backend_options=backend_options)
    manifest = dict(_bundle[1]) if _bundle is not None else {}
    if refinements is not None:
        manifest["export_refinements"] = refinements
    if refined.grouped_experts:
        manifest["export_grouped_experts"] = list(refined.grouped_experts)
    files = {**files, **(_bundle[0] if _bundle is not None else {})}
    if checkpoint is None:
        return lower_and_write(graph, out, target, cfg, passes=passes, dump_ir=dump_ir,
                               force=force, log=log, fallback=fallback, report=report,
                               aliases=aliases, eos_token_ids=eos, extra_files=files,
                               manifest_extra=manifest, vision=vision)
    graph = checkpoint.bind(graph, log)
    with checkpoint.streaming(log) as progress:
        return lower_and_write(graph, out, target, cfg, passes=passes, dump_ir=dump_ir,
                               force=force, log=log, progress=progress, fallback=fallback,
                               report=report, aliases=aliases, eos_token_ids=eos,
                               extra_files=files, manifest_extra=manifest, vision=vision)


def refined_shapes(dynamic_shapes: Any, refined: RefineState) -> Any:
    """The spec the export ran with: the user's, or the last refined one."""
    return refined.dynamic_shapes if refined.dynamic_shapes is not None else dynamic_shapes


def _log_refinements(graph: Graph, refined: RefineState, aliases: Mapping[str, str],
                     log: StageLog) -> dict[str, Any]:
    """Tell the user which fixes were applied and the ranges compiled; the manifest entry."""
    ranges = {name: [lo, hi] for name, (lo, hi) in sorted(graph.symbols.items())}
    fixes = [r.fix for r in refined.refinements]
    names = {sym: f" ({name})" for name, sym in aliases.items()}
    shown = ", ".join(f"{sym}{names.get(sym, '')} in [{lo}, {'inf' if hi is None else hi}]"
                      for sym, (lo, hi) in ranges.items()) or "none (all static)"
    log.line(f"  torch.export refused the dynamic shapes as given; applied its suggested fixes: "
             f"{'; '.join(fixes)}; compiled ranges: {shown}")
    return {"fixes": fixes, "ranges": ranges}


def _grouped_experts_line(names: list[str], shown: int = 3) -> str:
    """Which expert loops the export traced through transformers' grouped experts (a
    substitution the user should know of; the manifest lists them all)."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return (f"  {len(names)} expert loop(s) traced as transformers' grouped experts (a probe "
            f"showed the same outputs): {', '.join(names[:shown])}{more}")


def symbol_aliases(graph: Graph, dynamic_shapes: Any) -> dict[str, str]:
    """The user's torch.export Dim names for the graph's size symbols, e.g. {"seq": "s0"}.

    The IR names symbols s0, s1, ... (torch.export forgets Dim names); the manifest records
    these aliases so that `dayzero run --size seq=300` works as well as `--size s0=300`. Only
    unambiguous ones: a name used for two symbols, or that is itself a symbol, is left out.
    """
    if isinstance(dynamic_shapes, Mapping):
        per_input = list(dynamic_shapes.values())
    elif isinstance(dynamic_shapes, (list, tuple)):
        per_input = list(dynamic_shapes)
    else:
        return {}
    if len(per_input) != len(graph.inputs):
        return {}
    found: dict[str, set[str]] = {}
    for value, dims in zip(graph.inputs, per_input):
        if isinstance(dims, Mapping):
            items = dims.items()
        elif isinstance(dims, (list, tuple)):
            items = enumerate(dims)
        else:
            continue
        for index, dim in items:
            name = getattr(dim, "__name__", None)
            if not isinstance(name, str) or not isinstance(index, int) or \
                    not 0 <= index < len(value.type.shape):
                continue
            size = value.type.shape[index]
            text = size if isinstance(size, str) else getattr(size, "name", None)
            if isinstance(text, str) and text in graph.symbols:
                found.setdefault(name, set()).add(text)
    return {name: next(iter(syms)) for name, syms in sorted(found.items())
            if len(syms) == 1 and name not in graph.symbols}


def lower_and_write(graph: Graph, out: Path, target, cfg: CompileConfig, *,
                    passes: str | None, dump_ir, force: bool, log: StageLog,
                    progress: Any = None, fallback: str | None = None,
                    report: Callable[[str], None] | None = None,
                    aliases: Mapping[str, str] | None = None,
                    eos_token_ids: list[int] | None = None,
                    extra_files: Mapping[str, bytes] | None = None,
                    manifest_extra: Mapping[str, Any] | None = None,
                    vision: Mapping[str, Any] | None = None) -> Path:
    """Run the pipeline on an exported graph and write the artifact for `target`.

    `eos_token_ids` (a list, maybe empty) makes it a generation artifact: the pipeline ends
    with `derive_generation_step` and the manifest gets its `generation` section.

    `progress` (total weight bytes -> callback or None) replaces the plain progress bar.
    `aliases` (Dim name -> size symbol, see `symbol_aliases`) go into the manifest.
    `vision` (an image-text model's encoder, compiler/image_text.py) goes into the
    `generation` section; its files come in `extra_files`.
    """
    from compiler.writer import write_artifact
    from passes import DEFAULT_PIPELINE, PassManager, format_pipeline, parse_pipeline
    from passes.fusion.decompose import decompose_unsupported
    from passes.fusion.report import fusion_report, misses_of, op_counts, records_of
    from passes.plan_memory import memory_plan_for

    pipeline = parse_pipeline(passes or _default_pipeline(cfg, target, DEFAULT_PIPELINE))
    pipeline = _with_quantization(_with_precision(pipeline, cfg), cfg)
    forward = None
    if eos_token_ids is not None:
        from compiler.writer import value_spec
        from passes import get_pass

        from .generation import cache_dtype, forward_signature, generation_pipeline

        forward = forward_signature(graph, value_spec)
        pipeline = generation_pipeline(pipeline, get_pass, cache_dtype(cfg),
                                       cfg.parallel.get("tensor_parallel", 1))
    manager = PassManager(pipeline, dump_dir=dump_ir, log=log.line)
    before = op_counts(graph)  # passes change the graph in place
    with log.stage("passes", format_pipeline(pipeline)):
        _explain_pipeline(pipeline, graph, cfg, target, passes, log)
        try:
            graph = manager.run(graph)
        except OSError as exc:  # --dump-ir's folder
            raise _write_error(exc, Path(dump_ir) if dump_ir else out) from exc
    if report is not None:
        report(fusion_report(before, graph, records_of(manager), misses_of(manager)))
    generation = None
    if forward is not None:  # read from the step's paged_attention nodes, before lowering
        from .generation import TOKENIZER_DIR, generation_section

        generation = generation_section(graph, forward, cfg, eos_token_ids,
                                        sorted(f for f in extra_files or {}
                                               if f.startswith(TOKENIZER_DIR + "/")))
        if vision is not None:
            generation["vision"] = dict(vision)
    if _world_size(cfg) > 1:
        return _write_partitioned(graph, out, target, cfg, format_pipeline(pipeline),
                                  dump_ir=dump_ir, force=force, log=log, aliases=aliases,
                                  generation=generation, extra_files=extra_files)
    fallback_target = _backend(fallback) if fallback else None
    _check_symbolic_shapes(graph, target, fallback_target)
    # fused ops a backend has no kernel for run as their decomposition into primitive ops, on
    # the target where it runs them (the fallback only gets what the target cannot run)
    decompose_unsupported(graph, target.supports)
    _check_supported(graph, target, fallback=fallback_target)
    options = _lower_options(cfg, target.name, fallback)
    extra = {**(manifest_extra or {}), "pipeline": format_pipeline(pipeline),
             "config": {"parallel": cfg.parallel, "precision": cfg.precision,
                        "quantize": cfg.quantize}}
    if aliases:
        extra["symbol_aliases"] = dict(aliases)
    if generation is not None:
        extra["generation"] = generation
    memory_plan = memory_plan_for(pipeline, graph)  # the final graph's plan, if one is asked for
    if memory_plan is not None:
        extra["memory_plan"] = memory_plan
    with log.stage("lower+write", f"backend {target.name} -> {out}"):
        total = sum(int(getattr(t, "nbytes", 0)) for t in graph.weight_data.values())
        bar = progress(total) if progress is not None else log.progress(total, "weights")
        try:
            path = write_artifact(out, graph, target, options=options, force=force,
                                  manifest_extra=extra, progress=bar, extra_files=extra_files)
        except OSError as exc:
            raise _write_error(exc, out) from exc
    log.line(f"wrote {path}")
    return path


def _check_destinations(out: Path, force: bool, dump_ir) -> None:
    """The artifact's and --dump-ir's locations can be written, checked before export."""
    from compiler.writer import check_destination

    check_destination(out, force)
    if dump_ir is not None:
        check_destination(Path(dump_ir), force=True, folder_ok=True, what="--dump-ir folder")


def _write_error(exc: OSError, out: Path) -> DayzeroError:
    """An OSError while writing (disk full, file too large, permissions) as a user error."""
    import errno

    reason = exc.strerror or str(exc)
    fixes = {errno.ENOSPC: "free disk space, or write the artifact to another disk",
             errno.EDQUOT: "free disk space (quota), or write the artifact to another disk",
             errno.EFBIG: "the file size limit was reached (ulimit -f, or the filesystem's "
                          "limit): raise it or write the artifact to another disk"}
    where = str(exc.filename) if exc.filename else str(out)
    return DayzeroError(f"writing {out} failed: {reason}", where,
                        fixes.get(exc.errno, "choose a writable output location"))


def _explain_pipeline(pipeline: list, graph: Graph, cfg: CompileConfig, target,
                      passes: str | None, log: StageLog) -> None:
    """Log lines that say what the config did to the pipeline: the passes a partitioned compile
    leaves out of the backend's own pipeline, and what weight quantization will cover."""
    if _world_size(cfg) > 1 and not (passes or cfg.passes) and target.default_pipeline:
        from passes import DEFAULT_PIPELINE, parse_pipeline

        kept = {p.name for p in parse_pipeline(DEFAULT_PIPELINE)}
        skipped = [p.name for p in parse_pipeline(target.default_pipeline) if p.name not in kept]
        if skipped:
            log.line(f"  note: {', '.join(skipped)} skipped: a partitioned compile "
                     f"(parallel: {_mesh_text(cfg)}) runs the default pipeline, not backend "
                     f"{target.name}'s, because tensor parallelism shards the unfused "
                     "projections")
    names = [p.name for p in pipeline]
    if "quantize_weights" in names:
        index = names.index("quantize_weights")
        if all(name == "precision" for name in names[:index]):  # it sees this graph
            for line in pipeline[index].survey(graph).splitlines():
                log.line(f"  {line}")


def _mesh_text(cfg: CompileConfig) -> str:
    return ", ".join(f"{k} {v}" for k, v in cfg.parallel.items() if v != 1)


def _default_pipeline(cfg: CompileConfig, target, default: str) -> str:
    """The config's `passes:`, else the backend's own pipeline (single device), else `default`.
    Partitioned compiles keep `default`: tensor parallelism shards unmerged projections; with
    expert parallelism it also fuses the MoE blocks (only those) into the `moe` ops it splits."""
    if cfg.passes:
        return ",".join(cfg.passes)
    if _world_size(cfg) == 1 and target.default_pipeline:
        return target.default_pipeline
    if cfg.parallel.get("expert_parallel", 1) > 1:
        from passes.parallel.shard_expert_parallel import with_moe_fusion

        return with_moe_fusion(default)
    return default


def _world_size(cfg: CompileConfig) -> int:
    from passes.parallel import Mesh

    return Mesh.from_config(cfg.parallel).world_size


def _write_partitioned(graph: Graph, out: Path, target, cfg: CompileConfig, pipeline: str, *,
                       dump_ir, force: bool, log: StageLog,
                       aliases: Mapping[str, str] | None = None,
                       generation: dict[str, Any] | None = None,
                       extra_files: Mapping[str, bytes] | None = None) -> Path:
    """Partition over the `parallel:` mesh and write one graph and weight shards per rank.

    A generation step (`generation`, its manifest section) keeps its KV cache sharded: each
    rank's graph reads and returns only its own KV heads (passes/parallel/kv_cache_shards.py)."""
    from compiler.writer import write_artifact
    from passes.parallel import Mesh
    from passes.parallel.partition import partition

    _check_symbolic_shapes(graph, target)
    mesh = Mesh.from_config(cfg.parallel)
    with log.stage("partition", str(mesh)):
        plan = partition(graph, mesh, dump_dir=Path(dump_ir) / "parallel" if dump_ir else None,
                         log=log.line)
        if generation is not None:
            from passes.parallel.kv_cache_shards import keep_cache_local

            keep_cache_local(plan)
        layout = plan.manifest()
        for stage in layout["stages"]:
            log.line(f"  stage {stage['stage']}: nodes {stage['nodes']}, cost {stage['cost']}")
    for program in plan.ranks:  # communication runs in the runtime, between backend segments
        _check_supported(program.graph, target, skip=COMMUNICATION_OPS)
    extra = {"pipeline": pipeline, "parallel": layout,
             "config": {"parallel": cfg.parallel, "precision": cfg.precision,
                        "quantize": cfg.quantize}}
    if aliases:
        extra["symbol_aliases"] = dict(aliases)
    if generation is not None:
        extra["generation"] = generation
    with log.stage("lower+write", f"backend {target.name}, {mesh.world_size} ranks -> {out}"):
        total = sum(int(getattr(t, "nbytes", 0)) for r in plan.ranks
                    for t in r.graph.weight_data.values())
        try:
            path = write_artifact(out, plan.graph, target, options=cfg.options_for(target.name),
                                  force=force, manifest_extra=extra,
                                  progress=log.progress(total, "weights"), ranks=plan.ranks,
                                  extra_files=extra_files)
        except OSError as exc:
            raise _write_error(exc, out) from exc
    log.line(f"wrote {path}")
    return path


def _lower_options(cfg: CompileConfig, backend: str, fallback: str | None) -> dict[str, Any]:
    """The options `lower` gets: the backend's own; with a fallback, its name and (when set)
    the fallback backend's options as `fallback_options`, for the segments it lowers."""
    options = cfg.options_for(backend)
    if fallback:
        options["fallback"] = fallback
        if cfg.options_for(fallback):
            options["fallback_options"] = cfg.options_for(fallback)
    return options


def _backend(name: str):
    import backends

    return backends.get(name)


def _check_symbolic_shapes(graph: Graph, target, fallback=None) -> None:
    """A backend whose capabilities say `symbolic_shapes=False` builds its payload for one set
    of sizes: a graph with size symbols is refused before lowering, naming where they enter
    (with a fallback that handles them, the nodes go there instead)."""
    if not graph.symbols or target.capabilities().symbolic_shapes or (
            fallback is not None and fallback.capabilities().symbolic_shapes):
        return
    where = [f"input '{v.name}' dim {i} = {d}" for v in graph.inputs
             for i, d in enumerate(v.type.shape) if not symbolic.is_static(d)]
    raise DayzeroError(f"backend '{target.name}' needs static shapes, but the graph has size "
                       f"symbols {', '.join(sorted(graph.symbols))} ({'; '.join(where[:3])})",
                       f"backend {target.name}",
                       "compile with static sizes (no dynamic_shapes), or choose a backend "
                       "with symbolic shapes (dayzero backends lists them)")


def _check_supported(graph: Graph, target, skip: frozenset[str] = frozenset(),
                     fallback=None) -> None:
    missing: dict[str, list] = {}
    for node in graph.nodes:
        if node.op not in skip and not target.supports(node) and \
                not (fallback is not None and fallback.supports(node)):
            missing.setdefault(node.op, []).append(node)
    if missing:
        lines = [f"{op} ({len(nodes)}x, first at {nodes[0].loc or 'unknown location'})"
                 for op, nodes in sorted(missing.items())]
        raise DayzeroError(f"backend '{target.name}' does not support: " + "; ".join(lines),
                           f"backend {target.name}",
                           "choose another backend (dayzero backends lists them)")


def _with_precision(pipeline: list, cfg: CompileConfig) -> list:
    """The `precision:` config as a `precision` pass at the head of the pipeline (unless the
    pipeline already has one, whose options then rule)."""
    from passes import get_pass

    weight, activation = cfg.precision["weight_dtype"], cfg.precision["activation_dtype"]
    if (weight, activation) == ("fp32", "fp32") or any(p.name == "precision" for p in pipeline):
        return pipeline
    return [get_pass("precision")(weight_dtype=weight, activation_dtype=activation), *pipeline]


def _with_quantization(pipeline: list, cfg: CompileConfig) -> list:
    """The `quantize:` config as a `quantize_weights` pass at the head of the pipeline, before
    fusion takes the linears into fused ops, and a `quantize_experts` pass right after the first
    `fuse`, which gathers the MoE experts into the stacks it quantizes (unless the pipeline has
    them already)."""
    from passes import get_pass

    kind = cfg.quantize.get("weights")
    if kind is None:
        return pipeline
    options = dict(bits={"int4": 4, "int8": 8}[kind], group_size=cfg.quantize["group_size"],
                   activations=cfg.quantize["activations"])
    names = [p.name for p in pipeline]
    if "quantize_experts" not in names and "fuse" in names:
        at = names.index("fuse") + 1
        pipeline = [*pipeline[:at], get_pass("quantize_experts")(**options), *pipeline[at:]]
    if "quantize_weights" not in names:
        pipeline = [get_pass("quantize_weights")(**options), *pipeline]
    return pipeline


# precision values the precision pass implements (fp8 is a quantization format: not yet)
_IMPLEMENTED = {("precision", "weight_dtype"): ("fp32", "bf16", "fp16"),
                ("precision", "activation_dtype"): ("fp32", "bf16", "fp16"),
                ("precision", "kv_cache_dtype"): ("fp32", "int8"),
                ("quantize", "weights"): ("int4", "int8")}


def _refuse_unimplemented(cfg: CompileConfig) -> None:
    """Valid config values this version cannot honour yet are refused, never ignored."""
    defaults = {"precision": "fp32", "quantize": None}
    for section in ("precision", "quantize"):
        for key, value in cfg.section(section).items():
            if key in ("group_size", "activations") or \
                    value in _IMPLEMENTED.get((section, key), ()):
                continue
            if value != defaults[section]:
                raise DayzeroError(f"config key '{section}.{key}: {value}' is valid but not "
                                   "supported by this version yet", cfg.source,
                                   f"remove '{section}.{key}' or set it to its default")
