"""Folders a killed process left behind: named with their owner's pid, swept once it is gone.

SIGKILL cannot be caught, so a process that writes a temporary folder (the artifact writer, the
local launcher) puts its pid in the folder's name, and the next one sweeps the folders whose pid
no longer runs. Folders named without a pid (by an older dayzero) are swept once they are old.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path


def pid_running(pid: int) -> bool:
    """Whether a process with this pid exists (another user's counts as running)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return pid < 2**31
    return True


def sweep(parent: Path, name: re.Pattern[str], max_age: float) -> list[Path]:
    """Remove the folders in `parent` whose name matches `name` and that are stale; returns them.

    `name`'s first group is the owner's pid (stale once it no longer runs); when it matched
    nothing, the folder is stale once older than `max_age` seconds.
    """
    removed = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return removed
    now = time.time()
    for path in entries:
        match = name.match(path.name)
        if match is None or path.is_symlink() or not path.is_dir():
            continue
        try:
            pid = match.group(1)
            stale = not pid_running(int(pid)) if pid else now - path.stat().st_mtime > max_age
        except OSError:
            continue
        if stale:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
