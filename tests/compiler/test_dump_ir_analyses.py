"""`dayzero compile --dump-ir`: the dumps print the analyses cached on the graph after it."""

from __future__ import annotations

import json
from pathlib import Path

from compiler.cli import main
from compiler.ir import parse_ir, print_ir

MLP = f"{Path(__file__).resolve().parents[2]}/examples/mlp.py:build"


def test_dump_after_plan_memory_shows_the_recorded_plan(tmp_path):
    out, dump = tmp_path / "m.dz", tmp_path / "ir"
    assert main(["compile", MLP, "-o", str(out), "--backend", "reference",
                 "--dump-ir", str(dump)]) == 0
    (path,) = dump.glob("*-plan_memory.dzir")
    text = path.read_text()
    plan = json.loads((out / "manifest.json").read_text())["memory_plan"]
    block = text[text.index("# analysis memory_plan{"):].splitlines()
    assert block[1].startswith(f"#   arena {plan['arena_bytes']} B (lower bound "
                               f"{plan['lower_bound']} B")
    assert len([line for line in block if "offset" in line]) == len(plan["buffers"])
    assert print_ir(parse_ir(text, str(path))) == (out / "graph.dzir").read_text()
    assert all("# analysis memory_plan" not in p.read_text() for p in dump.glob("*.dzir")
               if p != path)
