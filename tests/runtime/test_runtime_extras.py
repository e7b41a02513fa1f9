"""What the runtime-only distribution (packaging/runtime) needs beyond its dependencies is in one
of its extras, and the README names the extra text generation needs: after `pip install
./packaging/runtime` alone, `generate_text` and chat stop at the missing tokenizers and jinja2.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "packaging/runtime/pyproject.toml").read_text())["project"]
FIRST_PARTY = {"compiler", "runtime", "backends", "passes", "dayzero"}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", name).group()).lower()


def _third_party_imports(package: str) -> dict[str, set[str]]:
    """Top-level module -> the files of `package` (not its subpackages) importing it, for
    every import that is neither the standard library nor first-party."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package.replace(".", "/")).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in FIRST_PARTY:
                    found.setdefault(top, set()).add(path.name)
    return found


def _distributions() -> dict[str, str]:
    """Top-level module -> the canonical name of the distribution installing it."""
    return {module: _canonical(dists[0])
            for module, dists in importlib.metadata.packages_distributions().items()}


def test_every_runtime_import_is_a_dependency_or_in_an_extra():
    declared = {_canonical(r) for r in PROJECT["dependencies"]}
    extras = {name: {_canonical(r) for r in reqs}
              for name, reqs in PROJECT["optional-dependencies"].items()}
    imports = {**_third_party_imports("runtime"), **_third_party_imports("runtime.generation")}
    assert {"tokenizers", "jinja2", "torch"} <= set(imports)
    distribution = _distributions()
    for module, files in imports.items():
        dist = distribution[module]
        assert dist in declared or any(dist in reqs for reqs in extras.values()), (
            f"{module} ({dist}), imported by {sorted(files)}, is in no extra of "
            "packaging/runtime/pyproject.toml")
    generation = _third_party_imports("runtime.generation")
    text = {m for m, files in generation.items()
            if files & {"tokenizer.py", "chat_template.py", "chat_template_worker.py"}}
    assert text and {distribution[m] for m in text} <= extras["generate"]


def test_readme_installs_the_runtime_with_the_generate_extra():
    section = (ROOT / "README.md").read_text().split("## Running artifacts without the compiler")[1]
    section = section.split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert any('pip install "./packaging/runtime[generate]"' in block for block in blocks)


def test_a_missing_tokenizers_package_names_the_generate_extra(monkeypatch):
    """Without tokenizers (the runtime-only install without its extra) the error's fix is the
    extra to install, not a bare package name."""
    import builtins

    import pytest

    from compiler.errors import DayzeroError
    from runtime.generation.tokenizer import ArtifactTokenizer

    real_import = builtins.__import__

    def no_tokenizers(name, *args, **kwargs):
        if name == "tokenizers" or name.startswith("tokenizers."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tokenizers)
    with pytest.raises(DayzeroError) as err:
        ArtifactTokenizer({}, "m.dz")
    assert './packaging/runtime[generate]' in err.value.fix, err.value.message()
