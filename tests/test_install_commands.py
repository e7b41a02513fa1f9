"""README's setup commands and .ci/run install the same pinned versions, and nothing of the tests.

A fresh clone must stay green when a dependency publishes a release: every version comes from
constraints.txt (refreshed on purpose by .ci/refresh-constraints), and CI installs exactly as the
README says.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PIN_ENV = 'export PIP_CONSTRAINT="$PWD/constraints.txt"'


def _name(requirement: str) -> str:
    """The canonical project name of a requirement string ('Foo_bar>=1' -> 'foo-bar')."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", requirement).group()).lower()


def readme_commands() -> list[str]:
    """The two one-line commands of README's "Two commands" section, in order."""
    section = (ROOT / "README.md").read_text().split("## Two commands", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section)


def pins() -> dict[str, str]:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    pairs = [line.split("==") for line in lines if line and not line.startswith("#")]
    return {_name(name): version for name, version in pairs}


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {_name(r) for r in project["dependencies"]}
    for extra in project["optional-dependencies"].values():
        names |= {_name(r) for r in extra}
    return names


def test_readme_and_ci_install_through_the_constraints_file():
    main_job, tests = readme_commands()
    for command in (main_job, tests):
        steps = command.split(" && ")
        assert PIN_ENV in steps and steps.index(PIN_ENV) < steps.index("pip install torch==2.13.0")
    assert "tests/plugin" not in tests  # the tests register their plugin themselves
    ci = (ROOT / ".ci/run").read_text()
    installs = [line.replace(" -q", "") for line in ci.splitlines() if line.startswith("pip ")]
    readme_installs = [s for s in tests.split(" && ") if s.startswith("pip ")]
    assert installs == readme_installs
    assert PIN_ENV in ci and ci.index(PIN_ENV) < ci.index("pip install")
    assert tests.split(" && ")[-1] in ci.replace(" -p no:cacheprovider", "")


def test_every_declared_dependency_is_pinned():
    pinned = pins()
    assert pinned["torch"] == "2.13.0" and pinned["setuptools"]
    assert declared() - set(pinned) == set(), "run bash .ci/refresh-constraints"
    assert all(re.fullmatch(r"[0-9][0-9A-Za-z.!+-]*", v) for v in pinned.values())


def test_this_environment_was_installed_from_the_constraints():
    """The suite runs on the pinned versions (as .ci/run installs them), not on whatever pip
    resolved; a developer venv made otherwise fails here first, with the command to fix it."""
    pinned = pins()
    wrong = {}
    for name in sorted(declared() & set(pinned)):
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # an extra this environment did not install
        if version.split("+")[0] != pinned[name]:
            wrong[name] = (version, pinned[name])
    if wrong:
        pytest.fail(f"installed versions differ from constraints.txt: {wrong}; reinstall with "
                    'PIP_CONSTRAINT="$PWD/constraints.txt" pip install -e ".[test]"')
