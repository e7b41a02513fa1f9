"""packaging/runtime (the `dayzero-runtime` distribution) ships exactly what the runtime imports.

The runtime's import closure is computed from the sources with `ast`: every import statement of
the runtime and of the onnxruntime backend (which the registry imports by name), in function
bodies too, followed through first-party modules; `if TYPE_CHECKING:` imports are annotations
only. The distribution's packages must cover the closure, hold nothing of the compile side, and
each be needed; setuptools then copies exactly those files.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DIST = ROOT / "packaging" / "runtime"
FIRST_PARTY = ("compiler", "runtime", "backends", "passes", "dayzero")
ENTRY = ("runtime", "backends.onnxruntime")  # what `runtime.load` of an ORT artifact reaches
COMPILE_SIDE = ("passes", "dayzero", "compiler.frontend", "compiler.driver", "compiler.checkpoint",
                "compiler.commands", "compiler.tools", "compiler.cli", "backends.reference",
                "backends.triton")


def _file(module: str) -> Path | None:
    base = ROOT / module.replace(".", "/")
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _lazy_exports(package: str) -> dict[str, str]:
    """Name -> submodule of a package whose `__init__` loads its names on first use (its
    `_EXPORTS` table: values a submodule name or a (submodule, attribute) pair)."""
    path = _file(package)
    for node in ast.parse(path.read_text()).body if path.name == "__init__.py" else []:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == "_EXPORTS":
            table = ast.literal_eval(node.value)
            return {name: f"{package}.{v if isinstance(v, str) else v[0]}"
                    for name, v in table.items()}
    return {}


def _imports(module: str) -> set[str]:
    """First-party modules `module` imports anywhere (but under `if TYPE_CHECKING:`)."""
    path = _file(module)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    stack: list[ast.AST] = [ast.parse(path.read_text())]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[:len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            found.add(base)
            lazy = _lazy_exports(base) if _file(base) is not None else {}
            found |= {lazy.get(alias.name, f"{base}.{alias.name}") for alias in node.names}
    return {m for m in found if m.split(".")[0] in FIRST_PARTY and _file(m) is not None}


def import_closure(entry: tuple[str, ...] = ENTRY) -> set[str]:
    """Every first-party module reachable from `entry`, with the packages above each."""
    seen: set[str] = set()
    todo = list(entry)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += sorted(_imports(module))
    return seen


def shipped() -> tuple[set[str], set[str]]:
    """(packages, modules) the distribution declares, modules as dotted names."""
    tool = tomllib.loads((DIST / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = set(tool["packages"])
    modules = set()
    for package in packages:
        for path in (ROOT / package.replace(".", "/")).glob("*.py"):
            modules.add(package if path.stem == "__init__" else f"{package}.{path.stem}")
    for module in tool.get("py-modules", []):
        modules |= {module, module.rpartition(".")[0]}
    return packages, modules


def test_the_closure_sees_deferred_imports_and_skips_annotations():
    closure = import_closure()
    assert {"runtime.model", "runtime.graph_checks", "compiler.ir.parser",
            "backends.onnxruntime.session", "compiler.errors"} <= closure
    assert "compiler.ir.graph" in closure  # through the graph check, not runtime.index_inputs
    assert _imports("runtime.index_inputs") == {"compiler.errors"}


def test_the_distribution_ships_the_closure_and_nothing_of_the_compile_side():
    closure = import_closure()
    packages, modules = shipped()
    assert closure - modules == set(), "the runtime imports modules the distribution lacks"
    for module in modules:
        assert not any(module == c or module.startswith(c + ".") for c in COMPILE_SIDE), module
    closure_packages = {m if _file(m).name == "__init__.py" else m.rpartition(".")[0]
                        for m in closure}
    # of compiler: __init__, errors and heap (leaf modules), and the IR
    assert packages == closure_packages - {"compiler"}
    assert {m for m in closure if m.startswith("compiler.") and m.count(".") == 1} == \
        {"compiler.errors", "compiler.heap", "compiler.ir"}


def test_setuptools_copies_exactly_the_declared_files(tmp_path):
    """`setup.py build_py` of the distribution (no compiler needed, a second or two)."""
    result = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "-d", str(tmp_path)],
                            cwd=DIST, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    built = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    _, modules = shipped()
    expected = {str(_file(m).relative_to(ROOT)) for m in modules} | {"compiler/ir/grammar.lark"}
    assert built == expected
