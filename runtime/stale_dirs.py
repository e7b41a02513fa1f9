"""Temporary folders that carry their owner's marker, and the sweep of those a killed owner left.

SIGKILL cannot be caught, so a process that makes a temporary folder (the artifact writer, the
local launcher) writes a marker into it before anything else: `.dayzero-temp`, JSON naming the
owner's pid, the owner's start time (the kernel's, so a reused pid is told apart), the host, the
boot and the folder's purpose. The next one sweeps the folders of its purpose whose owner is
provably gone. A name alone proves nothing: a user's `.thesis.12345678.tmp/` looks like ours,
so a folder without a valid marker is never removed, whatever its name or age; nor is one whose
marker another user wrote, or another host (a shared file system: its pids are not ours to
judge), or one whose owner may still run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
from pathlib import Path
from typing import Any

MARKER = ".dayzero-temp"
MARKER_VERSION = 1
_MAX_MARKER_BYTES = 4096  # a marker is ~200 bytes; a bigger file is not one of ours


def process_start(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (/proc/PID/stat field 22); None
    where it cannot be read (no such process, not Linux)."""
    try:
        text = Path(f"/proc/{int(pid)}/stat").read_text()
        return int(text[text.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def boot_id() -> str | None:
    """This boot's id (Linux): pids and start times restart with every boot."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


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


def mark(folder: Path, purpose: str) -> None:
    """Write this process's marker into `folder`, which it has just made (exclusively: a folder
    that already has a marker is not ours to claim)."""
    record = {"marker": MARKER_VERSION, "purpose": purpose, "pid": os.getpid(),
              "start": process_start(os.getpid()), "host": socket.gethostname(),
              "boot": boot_id()}
    fd = os.open(folder / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(record))


def unmark(folder: Path) -> None:
    """Remove the marker before the folder becomes something that lasts (an artifact)."""
    (folder / MARKER).unlink(missing_ok=True)


def make_marked_dir(path: Path, purpose: str) -> Path:
    """Make the folder `path` (it must not exist) with this process's marker; returns it."""
    path.mkdir()  # not tempfile.mkdtemp: an artifact keeps the user's umask, not mode 0700
    try:
        mark(path, purpose)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return path


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The marker of `folder` when it is one of ours, written by this user; None otherwise."""
    try:
        fd = os.open(folder / MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            return None
        data = os.read(fd, _MAX_MARKER_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        record = json.loads(data) if len(data) <= _MAX_MARKER_BYTES else None
    except (ValueError, RecursionError):
        return None
    return record if _valid(record) else None


def _valid(record: Any) -> bool:
    return (isinstance(record, dict) and record.get("marker") == MARKER_VERSION
            and isinstance(record.get("purpose"), str) and isinstance(record.get("host"), str)
            and type(record.get("pid")) is int and record["pid"] > 0
            and (record.get("start") is None or type(record.get("start")) is int)
            and (record.get("boot") is None or isinstance(record.get("boot"), str)))


def owner_gone(record: dict[str, Any]) -> bool:
    """Whether the process a marker names provably no longer runs on this host: the host
    rebooted since, the pid is free, or it now belongs to a process that started at another
    time (reused). A marker of another host is never judged gone."""
    if record["host"] != socket.gethostname():
        return False
    now = boot_id()
    if record.get("boot") is not None and now is not None:
        if record["boot"] != now:
            return True
    if not pid_running(record["pid"]):
        return True
    started = process_start(record["pid"])
    return record.get("start") is not None and started is not None and started != record["start"]


def sweep(parent: Path, name: re.Pattern[str], purpose: str) -> list[Path]:
    """Remove the folders in `parent` named like `name` whose marker has `purpose` and whose
    owner is provably gone (`owner_gone`); returns them. Unmarked folders are left alone."""
    removed = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return removed
    for path in entries:
        if name.match(path.name) is None or path.is_symlink() or not path.is_dir():
            continue
        record = read_marker(path)
        if record is None or record["purpose"] != purpose or not owner_gone(record):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
