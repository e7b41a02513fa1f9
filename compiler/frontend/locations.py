"""Source locations: which line of the user's model produced an FX node.

torch.export records a Python stack per node (`meta['stack_trace']`, outermost frame first). The
line a user wants to see is the innermost frame that is model code, not torch's own modules
(nn.Module plumbing, functional wrappers); that is what errors and IR `loc(...)` point at.
"""

from __future__ import annotations

import inspect
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)\n'
                    r'(?P<code>(?:[ \t]+(?!File ")[^\n]*\n?)?)', re.MULTILINE)
_TORCH_DIR = str(Path(torch.__file__).resolve().parent) + os.sep


@dataclass(frozen=True)
class Location:
    file: str
    line: int
    code: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"

    def describe(self) -> str:
        """`file:line (code)` for error messages."""
        return f"{self} ({self.code})" if self.code else str(self)


def display_path(path: str) -> str:
    """Short, stable file names: relative to the working directory, or to site-packages."""
    resolved = Path(path)
    try:
        return str(resolved.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        pass
    marker = f"site-packages{os.sep}"
    if marker in path:
        return path.split(marker, 1)[1]
    return path


def _is_torch_internal(path: str) -> bool:
    try:
        return str(Path(path).resolve()).startswith(_TORCH_DIR)
    except OSError:
        return False


def parse_stack(stack_trace: str | None) -> Location | None:
    """The innermost non-torch frame of an FX stack trace, or None if it has none."""
    if not stack_trace:
        return None
    frames = [m for m in _FRAME.finditer(stack_trace) if not _is_torch_internal(m["file"])]
    if not frames:
        return None
    last = frames[-1]
    return Location(display_path(last["file"]), int(last["line"]), last["code"].strip())


def node_location(node: torch.fx.Node) -> Location | None:
    return parse_stack(node.meta.get("stack_trace"))


def module_location(model: torch.nn.Module) -> Location:
    """Where `model.forward` is defined: the fallback for nodes torch gave no stack for."""
    forward = type(model).forward
    try:
        path = inspect.getsourcefile(forward) or "<unknown>"
        line = inspect.getsourcelines(forward)[1]
    except (OSError, TypeError):
        return Location(type(model).__qualname__, 0)
    return Location(display_path(path), line, f"{type(model).__qualname__}.forward")
