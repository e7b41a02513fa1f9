"""`dayzero inspect ARTIFACT|FILE.dzir`: print the IR and what the artifact records."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import DayzeroError


def add_parser(sub) -> None:
    p = sub.add_parser("inspect", help="print an artifact's or a .dzir file's IR")
    p.add_argument("path", metavar="ARTIFACT|FILE.dzir")
    p.add_argument("--memory", action="store_true", help="show the memory plan")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=inspect_command)


def inspect_command(args) -> int:
    from ..ir import parse_ir, print_ir

    path = Path(args.path)
    if args.memory:
        raise DayzeroError("--memory: memory plans are not recorded by this version",
                           "--memory", "inspect without --memory")
    if path.is_file():
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise DayzeroError(f"cannot read {path}: {exc}", str(path)) from None
        graph = parse_ir(text, source=str(path))
        manifest = None
    elif path.is_dir():
        from runtime.artifact import open_artifact

        artifact = open_artifact(path)
        graph = parse_ir(artifact.graph_text(), source=str(path / "graph.dzir"))
        manifest = dict(artifact.manifest)
    else:
        raise DayzeroError(f"{path} does not exist", str(path),
                           "give an artifact directory or a .dzir file")
    if args.json:
        print(json.dumps({"manifest": manifest, "graph": print_ir(graph)}, indent=2, default=str))
        return 0
    if manifest is not None:
        print(f"# artifact {path}: backend {manifest.get('backend')}, "
              f"format {manifest.get('format')} v{manifest.get('format_version')}")
        if manifest.get("pipeline"):
            print(f"# pipeline {manifest['pipeline']}")
    print(print_ir(graph), end="")
    return 0
