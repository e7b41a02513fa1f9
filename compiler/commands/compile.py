"""`dayzero compile SPEC -o OUT.dz`: load the SPEC and run the compile driver."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..config import (
    SCHEMA,
    CompileConfig,
    OptionAssignment,
    load_config,
    options_from_assignments,
    parse_assignment,
    parse_setting,
)
from ..errors import DayzeroError
from ..log import StageLog

BACKEND_OPTION_HELP = (
    "set a backend option (repeatable; later ones win; merged over the config's "
    "backend_options:). KEY is a dotted path under --backend's options, or under another "
    "backend's with a BACKEND: prefix; VALUE is YAML. onnxruntime takes session.<setting> "
    "(intra_op_threads, inter_op_threads, allow_spinning=true|false|auto, "
    "graph_optimization_level, execution_mode, cpu_mem_arena, mem_pattern) and "
    "exclude_kernels=[com.microsoft.Gelu]; e.g. --backend-option session.intra_op_threads=2, "
    "or with --backend triton --fallback onnxruntime: "
    "--backend-option onnxruntime:session.allow_spinning=false")


# flags that set one config key each, over the --config file: (flag, config key, argparse
# keywords, help); the value is written as in the file (YAML) and checked by the same schema
SETTING_FLAGS: tuple[tuple[str, str, dict, str], ...] = (
    ("--weight-dtype", "precision.weight_dtype", {"metavar": "{fp32,bf16,fp16}"},
     "store the weights in this dtype"),
    ("--quantize", "quantize.weights", {"metavar": "{int4,int8}"},
     "quantize the linear layers' weights in groups of the config's quantize.group_size "
     "(ONNX Runtime's MatMulNBits)"),
    ("--kv-cache-memory", "generation.kv_cache_memory", {"metavar": "SIZE"},
     "generation artifact: the paged KV cache's memory, e.g. 512MiB (dayzero generate and "
     "serve can override it when they load)"),
    ("--max-batch-tokens", "generation.max_batch_tokens", {"metavar": "N"},
     "generation artifact: the most tokens one step runs (prompt chunks and decodes together)"),
    ("--prefill-chunk", "generation.prefill_chunk", {"metavar": "N"},
     "generation artifact: the most prompt tokens of one sequence a step takes"),
    ("--block-size", "generation.block_size", {"metavar": "N"},
     "generation artifact: tokens per block of the paged KV cache"),
)


def _setting_dest(key: str) -> str:
    return "setting_" + key.replace(".", "_")


class _HelpWithPasses(argparse.Action):
    """`compile --help`: the options, then the passes and each backend's default pipeline.

    Listed only when help is asked for: importing the passes for every `dayzero` call would
    slow down the commands that do not need them."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.epilog = passes_help()
        parser.print_help()
        parser.exit()


def passes_help() -> str:
    """The pass listing of `compile --help`."""
    import backends
    from passes import DEFAULT_PIPELINE, describe_passes

    lines = ["passes (--passes a,b{option=value},c; the config's passes: takes the same names):"]
    lines += [f"  {line}" for line in describe_passes().splitlines()]
    lines.append("default pipelines (used without --passes or passes:):")
    for name in backends.available():
        try:
            pipeline = backends.get(name).default_pipeline
        except Exception:  # a broken plugin must not break --help
            continue
        lines.append(f"  {name}: {pipeline or DEFAULT_PIPELINE}")
    lines.append(f"  partitioned (parallel: in the config): {DEFAULT_PIPELINE}")
    return "\n".join(lines)


def add_parser(sub) -> None:
    p = sub.add_parser("compile", help="compile a model SPEC into an artifact", add_help=False,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-h", "--help", action=_HelpWithPasses,
                   help="show this help, the passes and the default pipelines, and exit")
    p.add_argument("spec", metavar="SPEC",
                   help="path/to/file.py:function, or a Hugging Face checkpoint folder")
    p.add_argument("-o", "--out", required=True, metavar="OUT.dz",
                   help="the artifact directory to write (refused if it exists, unless --force)")
    p.add_argument("--backend", default="onnxruntime", metavar="NAME",
                   help="the backend to lower to (default onnxruntime; `dayzero backends` lists "
                        "them with the ops each runs)")
    p.add_argument("--fallback", metavar="NAME",
                   help="backend for the nodes --backend does not support (e.g. --backend triton "
                        "--fallback onnxruntime)")
    p.add_argument("--config", metavar="FILE.yaml",
                   help="compile config: parallel:, precision:, quantize:, generation:, passes: "
                        "and backend_options: (docs/architecture.md); the flags below override "
                        "its keys")
    p.add_argument("--backend-option", action="append", default=[], type=backend_option,
                   dest="backend_options", metavar="[BACKEND:]KEY=VALUE",
                   help=BACKEND_OPTION_HELP)
    p.add_argument("--dump-ir", metavar="DIR", help="write the IR after every pass into DIR")
    p.add_argument("--passes", metavar="a,b,c", help="pass pipeline (overrides the config)")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no stage lines or progress bars (errors are still printed)")
    p.add_argument("--html", metavar="FILE",
                   help="with --report: also write the fusion report as one HTML page")
    p.add_argument("--report", dest="report", action="store_const", const="near",
                   help="print op counts before and after fusion, the patterns that fired and "
                        "why the patterns that matched partly did not; --report=all also lists "
                        "the patterns that stopped at their first node")
    # `--report=all` is an option string of its own (argparse looks the whole word up first):
    # an optional value (nargs="?") would take a SPEC written after --report as its value
    p.add_argument("--report=all", dest="report", action="store_const", const="all",
                   help=argparse.SUPPRESS)
    p.add_argument("--seq-len", metavar="MIN:MAX",
                   help="checkpoint SPEC: range of the dynamic sequence length of input_ids "
                        "(default 2:min(max_position_embeddings, 4096)); N for a static N")
    p.add_argument("--static-sizes", type=_sizes, metavar="N,N,...",
                   help="where torch.export fixes a dynamic dim to a constant (no dynamic "
                        "graph exists): the sizes to compile into the artifact (default: the "
                        "example's size and its three nearest powers of two)")
    p.add_argument("--task", choices=("text-generation", "forward"), default=None,
                   help="text-generation: a KV-cached generation artifact (dayzero generate); "
                        "default: text-generation for a checkpoint folder of a *ForCausalLM "
                        "architecture, forward otherwise")
    settings = p.add_argument_group("config settings (each overrides the same key of --config)")
    for flag, key, kind, what in SETTING_FLAGS:
        section, _, name = key.partition(".")
        default = SCHEMA[section][name][1]
        settings.add_argument(flag, dest=_setting_dest(key), default=None,
                              type=_setting_type(key), **kind,
                              help=f"{what} (config key {key}; default {default})")
    p.set_defaults(handler=compile_command)


def compile_command(args) -> int:
    from ..driver import compile
    from ..spec import load_spec

    log = StageLog(None if args.quiet else sys.stderr)
    cfg, backend_options, report = _check_before_loading(args)
    seq_range = _seq_range(args.seq_len)
    with log.stage("load", args.spec):
        spec = load_spec(args.spec, seq_range=seq_range)
        if spec.checkpoint is not None:
            log.line(f"  {spec.checkpoint.describe()}")
        elif seq_range is not None:
            raise DayzeroError("--seq-len applies to checkpoint folders only", args.spec,
                               "set the sequence range in the SPEC function's dynamic_shapes")
    task = args.task or default_task(spec.checkpoint)
    log.line(f"  task {task}")
    compile(spec.module, spec.example_inputs, out=args.out, backend=args.backend,
            dynamic_shapes=spec.dynamic_shapes, config=cfg, passes=args.passes,
            dump_ir=args.dump_ir, force=args.force, log=log, checkpoint=spec.checkpoint,
            fallback=args.fallback, report=report,
            backend_options=backend_options, task=task, static_sizes=args.static_sizes)
    print(args.out)
    return 0


def _check_before_loading(args) -> tuple[CompileConfig, dict, object]:
    """Everything the command line and the config decide, checked before the SPEC runs: loading
    a model takes seconds to minutes, and a typo must not cost them. The output location, the
    backends, the config with the flags over it, the pass pipeline, --report."""
    import backends
    from compiler.writer import check_destination
    from passes import parse_pipeline

    from ..driver import _refuse_unimplemented

    check_destination(args.out, args.force)
    for name in (args.backend, *([args.fallback] if args.fallback else [])):
        backends.get(name)
    backend_options = options_from_assignments(args.backend_options, args.backend)
    cfg = load_config(args.config).with_backend_options(backend_options, "--backend-option")
    for flag, key, _, _ in SETTING_FLAGS:
        value = getattr(args, _setting_dest(key))
        if value is not None:
            cfg = cfg.with_settings({key: value}, flag)
    _refuse_unimplemented(cfg)
    pipeline = args.passes or (",".join(cfg.passes) if cfg.passes else None)
    if pipeline:
        parse_pipeline(pipeline)
    if args.task == "text-generation":
        from ..generation import check_parallel

        check_parallel(cfg.parallel)
    return cfg, backend_options, _reporter(args)


def _sizes(text: str) -> list[int]:
    """--static-sizes 4,8,16."""
    try:
        sizes = [int(x) for x in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a list of sizes; write e.g. 4,8,16")
    return sizes


def default_task(checkpoint) -> str:
    """text-generation for a checkpoint of a causal LM (config.json's architecture is a
    *ForCausalLM class, or another class transformers' causal-LM auto mapping lists, such as
    GPT2LMHeadModel) or of an image-text model with its image processor (a LLaVA-style
    *ForConditionalGeneration, compiler/image_text.py), forward for anything else."""
    architecture = getattr(getattr(checkpoint, "model", None), "architecture", "")
    if not architecture:
        return "forward"
    from ..image_text import PROCESSOR_FILE, is_image_text

    if is_image_text(checkpoint.module) and (checkpoint.layout.root / PROCESSOR_FILE).is_file():
        return "text-generation"
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    causal = architecture.endswith("ForCausalLM") or \
        architecture in set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    return "text-generation" if causal else "forward"


def _seq_range(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    from ..checkpoint import parse_seq_range

    return parse_seq_range(text)


def _setting_type(key: str):
    """argparse type of a config-setting flag: a bad value is a usage error (exit 2)."""
    def parse(text: str):
        try:
            return parse_setting(key, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = key  # argparse names the type in some messages
    return parse


def backend_option(text: str) -> OptionAssignment:
    """argparse type: a bad `--backend-option` is a usage error (exit 2) with one message."""
    try:
        return parse_assignment(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; use [BACKEND:]KEY=VALUE, e.g. "
                                         "session.intra_op_threads=2") from None


def _reporter(args):
    """--report prints the fusion report; with --html it is also written as a page."""
    if args.html and not args.report:
        raise DayzeroError("--html writes the fusion report: it needs --report", "--html",
                           "add --report")
    if not args.report:
        return None
    if args.html and not os.access(Path(args.html).resolve().parent, os.W_OK):
        raise DayzeroError("cannot write the report there: the folder is missing or not "
                           "writable", args.html, "give --html a file in a folder you can write")

    def report(fusion) -> None:
        if args.report != "all":  # the near misses only: most patterns cannot apply at all
            fusion = fusion.near_misses()
        print(fusion)
        if args.html:
            from ..tools import fusion_html
            from ..tools.html_page import write_page

            path = write_page(args.html, fusion_html.render(
                fusion, f"dayzero compile --report: {args.spec}"))
            print(f"wrote {path}", file=sys.stderr)
    return report
