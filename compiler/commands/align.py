"""`dayzero align SPEC|ARTIFACT`: compare a backend with the reference, value by value.

Exit status 1 when a value exceeds its threshold; the message names the first one.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

from ..config import options_from_assignments
from ..errors import DayzeroError
from ..log import StageLog
from .compile import BACKEND_OPTION_HELP, backend_option
from .run import session_setting


def add_parser(sub) -> None:
    p = sub.add_parser("align", help="compare a backend with the reference interpreter, "
                       "value by value, and name the first divergence")
    p.add_argument("target", metavar="SPEC|ARTIFACT",
                   help="path/to/file.py:function, or a compiled artifact directory")
    p.add_argument("--backend", metavar="NAME",
                   help="backend to compile a SPEC for (default onnxruntime); an ARTIFACT "
                   "runs on the backend it was compiled for")
    p.add_argument("--fallback", metavar="NAME",
                   help="backend for the nodes --backend does not support (as in compile)")
    p.add_argument("--config", metavar="FILE.yaml", help="compile config for a SPEC")
    p.add_argument("--passes", metavar="a,b,c", help="pass pipeline for a SPEC")
    p.add_argument("--backend-option", action="append", default=[], type=backend_option,
                   dest="backend_options", metavar="[BACKEND:]KEY=VALUE",
                   help="for a SPEC, as in compile: " + BACKEND_OPTION_HELP)
    p.add_argument("--session", action="append", default=[], type=session_setting,
                   metavar="KEY=VALUE",
                   help="override a recorded onnxruntime session setting for this alignment, "
                        "as `dayzero run --session` (e.g. intra_op_threads=1)")
    p.add_argument("--artifact", metavar="ARTIFACT",
                   help="with a SPEC: align this artifact (compiled elsewhere) against the "
                   "SPEC's reference instead of compiling the SPEC")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    p.add_argument("--size", action="append", default=[], metavar="SYMBOL=N",
                   help="size of a symbolic dim for generated inputs")
    p.add_argument("--random", action="store_true",
                   help="with a SPEC: random inputs within the input specs instead of the "
                   "SPEC's example inputs")
    p.add_argument("--atol", type=float, metavar="X", help="absolute tolerance for every value")
    p.add_argument("--rtol", type=float, metavar="Y", help="relative tolerance for every value")
    p.add_argument("--all", action="store_true", help="list views and constants too")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--html", metavar="FILE", help="write an HTML report with error plots")
    p.set_defaults(handler=align_command)


def align_command(args) -> int:
    from ..tools.align_html import render
    from ..tools.align_target import run_alignment
    from ..tools.align_text import format_report
    from ..tools.html_page import write_page

    # with --json, stdout carries the JSON document only
    chatter = sys.stderr if args.json else sys.stdout
    log = StageLog(sys.stderr)
    session = options_from_assignments(args.session, "session").get("session")
    with _target(args, log) as target, contextlib.redirect_stdout(chatter):
        steps = _steps(args, target)
        reports = [(label, run_alignment(target, inputs, atol=args.atol, rtol=args.rtol,
                                         session=session)) for label, inputs in steps]
    if args.html:
        write_page(args.html, render(reports[-1][1]))
        print(f"wrote {args.html}", file=sys.stderr)
    if args.json:
        documents = [{"step": label, **report.to_json()} if label else report.to_json()
                     for label, report in reports]
        print(json.dumps(documents[0] if len(documents) == 1 else documents, indent=1))
    else:
        for label, report in reports:
            if label:
                print(f"== {label}")
            print(format_report(report, all_rows=args.all))
    return 0 if all(report.ok for _, report in reports) else 1


def _steps(args, target) -> list:
    """[(label, inputs)]: one unlabelled set, or for a generation artifact without --input a
    prefill and a decode step (compiler/tools/align_generation.py)."""
    if target.artifact.manifest.get("generation") is not None and not args.input:
        from ..tools.align_generation import generation_steps

        return generation_steps(target.artifact.root)
    return [(None, _inputs(args, target))]


def _is_artifact(path: str) -> bool:
    return (Path(path) / "manifest.json").is_file()


def _target(args, log: StageLog):
    import backends

    from ..spec import load_spec
    from ..tools.align_target import target_from_artifact, target_from_spec

    _check_target_exists(args.target)
    if _is_artifact(args.target):
        for flag in ("config", "passes", "artifact", "backend", "fallback", "backend_options"):
            if getattr(args, flag):
                raise DayzeroError(f"--{_flag(flag)} applies to a SPEC, not to an artifact",
                                   f"--{_flag(flag)}", "drop it (an artifact runs on the backend "
                                   "it was compiled for), or give the SPEC instead")
        return target_from_artifact(args.target)
    for flag in ("backend", "fallback", "config", "passes", "backend_options"):
        if args.artifact and getattr(args, flag):
            raise DayzeroError(f"--{_flag(flag)} with --artifact: the artifact is already "
                               "compiled (for its own backend, config and passes)",
                               f"--{_flag(flag)}",
                               f"drop --{_flag(flag)}, or drop --artifact to compile the SPEC")
    backend_options = options_from_assignments(args.backend_options,
                                               args.backend or "onnxruntime")
    # the backend first: some configure their runtime on import, before torch.export runs
    for name in ([_artifact_backend(args.artifact)] if args.artifact else
                 [args.backend or "onnxruntime", *([args.fallback] if args.fallback else [])]):
        backends.get(name)
    with log.stage("load", args.target):
        spec = load_spec(args.target)
    return target_from_spec(spec, backend=args.backend or "onnxruntime", config=args.config,
                            passes=args.passes, artifact=args.artifact, log=log,
                            fallback=args.fallback, backend_options=backend_options)


def _check_target_exists(target: str) -> None:
    """An ARTIFACT or SPEC that names nothing on disk says so, whatever its form: `align
    nosuch.dz` is a missing artifact to the user, not a malformed SPEC."""
    if Path(target).exists():
        return  # an artifact, a checkpoint folder, or a file load_spec says more of
    path, colon, _ = target.rpartition(":")
    if colon and Path(path).is_file():
        return  # file.py:function; load_spec says what is wrong with it, if anything
    raise DayzeroError(f"no artifact or SPEC exists at {path if colon else target}", target,
                       "give an artifact directory (dayzero compile ... -o NAME.dz writes one), "
                       "a checkpoint folder, or path/to/file.py:function of a file that exists")


def _flag(dest: str) -> str:
    return dest.replace("backend_options", "backend-option")


def _artifact_backend(path: str) -> str:
    from runtime import open_artifact

    return open_artifact(path, verify="size").backend


def _inputs(args, target):
    """--input files, else the SPEC's example inputs, else inputs generated from the specs."""
    from .run import _gather_inputs, _sizes

    if args.input or args.random or target.example_inputs is None:
        return _gather_inputs(target, args.input, _sizes(args.size))
    return target.example_inputs
