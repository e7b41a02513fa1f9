"""Every import of the packages, function-level ones included, follows `compiler.layering`."""

from __future__ import annotations

from pathlib import Path

import networkx as nx

from compiler import layering

ROOT = Path(__file__).resolve().parents[1]


def test_every_module_has_a_layer():
    assert layering.unplaced(ROOT) == []


def test_imports_follow_the_layering():
    bad = layering.violations(ROOT)
    assert not bad, "imports against compiler/layering.py:\n" + "\n".join(bad)


def test_no_cycles_between_subpackages():
    graph = layering.unit_graph(ROOT)
    cycles = [" -> ".join(f"{a} ({graph.edges[a, b]['where']})"
                          for a, b in zip(cycle, cycle[1:] + cycle[:1]))
              for cycle in nx.simple_cycles(graph)]
    assert not cycles, "import cycles between sub-packages:\n" + "\n".join(cycles)


def test_the_layer_data_is_a_downward_dag():
    for name, layer in layering.LAYERS.items():
        for used in layer.uses:
            assert used in layering.LAYERS, f"layer '{name}' uses unknown layer '{used}'"
            assert layering.FLOOR_OF[used] < layering.FLOOR_OF[name], (name, used)
    patterns = [p for layer in layering.LAYERS.values() for p in layer.modules]
    assert len(patterns) == len(set(patterns)), "a module prefix is in two layers"
    assert nx.is_directed_acyclic_graph(layering.allowed_graph())


def test_the_runtime_and_the_backends_are_kept_apart():
    may = layering.reachable()
    assert "registered passes" not in may["runtime"]
    assert "frontend" not in may["runtime"]
    assert "onnxruntime backend" not in may["triton backend"]
    assert "checkpoint" not in may["registered passes"]


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_function_level_and_relative_imports_are_read(tmp_path):
    root = _tree(tmp_path, {
        "runtime/__init__.py": "",
        "runtime/model.py": "from . import specs\n\ndef load():\n    from passes.fuse import F\n",
        "runtime/specs.py": "import compiler.ir\n",
        "passes/__init__.py": "",
        "passes/fuse.py": "",
        "passes/fusion/__init__.py": "",
        "passes/fusion/report.py": "def f():\n    from ..fuse import Fuse\n",
        "compiler/__init__.py": "",
        "compiler/ir/__init__.py": "",
    })
    found = {(i.source, i.target, i.line, i.function_level) for i in layering.imports(root)}
    assert found == {("runtime.model", "runtime.specs", 1, False),
                     ("runtime.model", "passes.fuse", 4, True),
                     ("runtime.specs", "compiler.ir", 1, False),
                     ("passes.fusion.report", "passes.fuse", 2, True)}
    assert layering.violations(root) == [
        "passes/fusion/report.py:2: passes.fusion.report -> passes.fuse "
        "(layer 'fusion rules' may not import layer 'registered passes')",
        "runtime/model.py:4: runtime.model -> passes.fuse "
        "(layer 'runtime' may not import layer 'registered passes')"]


def test_a_module_outside_every_layer_is_reported(tmp_path):
    root = _tree(tmp_path, {"compiler/__init__.py": "", "compiler/newstage.py": "",
                            "compiler/ir/__init__.py": ""})
    assert layering.unplaced(root) == ["compiler.newstage"]


def test_architecture_doc_shows_the_current_layers():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert layering.BEGIN in doc and layering.with_diagram(doc) == doc, \
        "regenerate it: python -m compiler.layering --update docs/architecture.md"
