"""`dayzero compile SPEC -o OUT.dz`: load the SPEC and run the compile driver."""

from __future__ import annotations

import sys

from ..log import StageLog


def add_parser(sub) -> None:
    p = sub.add_parser("compile", help="compile a model SPEC into an artifact")
    p.add_argument("spec", metavar="SPEC", help="path/to/file.py:function")
    p.add_argument("-o", "--out", required=True, metavar="OUT.dz")
    p.add_argument("--backend", default="onnxruntime")
    p.add_argument("--config", metavar="FILE.yaml")
    p.add_argument("--dump-ir", metavar="DIR", help="write the IR after every pass into DIR")
    p.add_argument("--passes", metavar="a,b,c", help="pass pipeline (overrides the config)")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.set_defaults(handler=compile_command)


def compile_command(args) -> int:
    from ..driver import compile
    from ..spec import load_spec

    log = StageLog(sys.stderr)
    with log.stage("load", args.spec):
        spec = load_spec(args.spec)
    compile(spec.module, spec.example_inputs, out=args.out, backend=args.backend,
            dynamic_shapes=spec.dynamic_shapes, config=args.config, passes=args.passes,
            dump_ir=args.dump_ir, force=args.force, log=log)
    print(args.out)
    return 0
