"""An environment as one `pip install -e ".[extras]"` of dayzero leaves it, made from this one.

The docs' commands must work after the install the docs give for them, not because the test
environment (`.[test]`) happens to hold more (matplotlib made `inspect --plot` pass in CI while
it failed after the README's own install). A throwaway venv's site-packages links the entries of
the distributions that install brings, dayzero's requirements and its extras' followed
transitively through the installed metadata, and nothing else: a package outside it is not
importable there, and its metadata is absent too, exactly as if it had never been installed.
Nothing is downloaded or copied; creating one takes well under a second.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(sysconfig.get_paths()["purelib"])
# `pip install -e .`, `pip install -e ".[hf,plot]"`, `pip install -e '.[serve]'`
_INSTALL = re.compile(r"""pip install -e (["']?)\.(?:\[([\w,-]+)\])?\1(?:\s|$)""")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def install_extras(command: str) -> set[str] | None:
    """The extras a `pip install -e .[...]` of dayzero in `command` names (an empty set for a
    plain `pip install -e .`); None when it installs no dayzero."""
    found = _INSTALL.search(command)
    if found is None:
        return None
    return set(filter(None, (found.group(2) or "").split(",")))


def _own_requirements(extras: set[str]) -> list[Requirement]:
    """dayzero's requirements and those of `extras`, from the tree's pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    unknown = extras - set(project["optional-dependencies"])
    if unknown:
        raise ValueError(f"pyproject.toml declares no extra {sorted(unknown)}")
    texts = project["dependencies"] + [r for e in sorted(extras)
                                       for r in project["optional-dependencies"][e]]
    return [Requirement(text) for text in texts]


def _installed() -> dict[str, importlib.metadata.Distribution]:
    """The distributions of this environment's site-packages, by canonical name (not the
    egg-info of a source tree that happens to be on sys.path)."""
    found = {}
    for dist in importlib.metadata.distributions(path=[str(SITE)]):
        found.setdefault(_canonical(dist.metadata["Name"]), dist)
    return found


def closure(extras: set[str]) -> set[str]:
    """Canonical names of the installed distributions `pip install -e ".[extras]"` brings:
    dayzero and its requirements, followed through each one's own (with the extras asked of
    it, markers evaluated here)."""
    installed = _installed()
    seen: set[tuple[str, str]] = set()
    todo = [(req, "") for req in _own_requirements(extras)]
    names = {"dayzero"}
    while todo:
        req, asked_as = todo.pop()
        name = _canonical(req.name)
        if req.marker is not None and not req.marker.evaluate({"extra": asked_as}):
            continue
        if name not in installed:
            continue
        for extra in sorted(req.extras) or [""]:
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            names.add(name)
            todo += [(Requirement(text), extra) for text in installed[name].requires or []]
    return names


def _entries(dist: importlib.metadata.Distribution) -> set[str]:
    """The top-level site-packages entries a distribution's RECORD lists."""
    return {f.parts[0] for f in dist.files or () if f.parts and f.parts[0] != ".."}


class InstallEnv:
    """A venv at `folder` holding what `pip install -e ".[extras]"` would; `add` installs
    more extras into it (`pip install -e ".[serve]"` later in a doc)."""

    def __init__(self, folder: Path, extras: set[str]):
        self.folder = folder
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True,
                       capture_output=True)
        self.site = Path(sysconfig.get_path(
            "purelib", vars={"base": str(folder), "platbase": str(folder)}))
        self.python = folder / "bin" / "python"
        self.extras: set[str] = set()
        self.add(extras)

    def add(self, extras: set[str]) -> None:
        self.extras |= set(extras)
        allowed = closure(self.extras)
        owners: dict[str, set[str]] = {}
        for name, dist in _installed().items():
            for entry in _entries(dist):
                owners.setdefault(entry, set()).add(name)
        for entry in sorted(os.listdir(SITE)):
            if entry not in owners or owners[entry] & allowed:
                link = self.site / entry
                if not link.exists():
                    link.symlink_to(SITE / entry)

    def blocked(self) -> set[str]:
        """Canonical names of this environment's distributions that are not in the venv."""
        return set(_installed()) - closure(self.extras)

    def env(self) -> dict[str, str]:
        """Process environment for commands run in the venv: its bin first on PATH."""
        env = dict(os.environ, VIRTUAL_ENV=str(self.folder))
        env["PATH"] = f"{self.folder / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env.pop("PYTHONPATH", None)
        return env
