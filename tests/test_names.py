"""Names that explain themselves: one class per name across the packages, and every built-in
pass in a module named as the pass it registers."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import passes
from compiler import layering

ROOT = Path(__file__).resolve().parents[1]

# Renames this check waits for, in files that were being edited elsewhere when it was written.
# Remove an entry once its rename is done.
PENDING_CLASS_NAMES: set[str] = set()
PENDING_PASS_MODULES: set[str] = set()


def class_definitions(root: Path) -> dict[str, list[str]]:
    """Class name -> the files defining it (top-level and nested classes alike)."""
    found = defaultdict(list)
    for path in layering.modules(root).values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                found[node.name].append(str(path.relative_to(root)))
    return found


def test_class_names_are_unique():
    dup = {name: files for name, files in class_definitions(ROOT).items()
           if len(files) > 1 and name not in PENDING_CLASS_NAMES}
    assert not dup, f"one name, several classes: {dup}"


def test_pending_renames_are_still_pending():
    """An entry of the pending lists that is no longer needed must go (so the list shrinks)."""
    defined = class_definitions(ROOT)
    assert all(len(defined[name]) > 1 for name in PENDING_CLASS_NAMES)
    assert all(_module_of(name) != name for name in PENDING_PASS_MODULES)


def test_the_check_sees_a_duplicate(tmp_path):
    for rel in ("runtime/a.py", "passes/b.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("class Plan:\n    class Inner:\n        pass\n")
    assert class_definitions(tmp_path)["Plan"] == ["passes/b.py", "runtime/a.py"]


def _module_of(pass_name: str) -> str:
    return passes.get_pass(pass_name).__module__.rpartition(".")[2]


def test_pass_modules_are_named_as_their_pass():
    builtin = [n for n in passes.available_passes()
               if passes.get_pass(n).__module__.startswith("passes.")]
    assert len(builtin) >= 15
    wrong = {n: _module_of(n) for n in builtin
             if _module_of(n) != n and n not in PENDING_PASS_MODULES}
    assert not wrong, f"pass name -> module: {wrong}"
