"""How much memory this process can still take: the least of the system's available memory and
what its cgroup (a container's limit) leaves, read from /proc and /sys without psutil.

Used to refuse a size an artifact or a caller asks for (the KV cache pool) before allocating
it: numpy asked for 2**50 bytes raises MemoryError, and a size just under the machine's memory
is handed out page by page until the kernel kills the process. None where nothing can be read
(not Linux, a restricted /proc): then nothing is refused on this ground.
"""

from __future__ import annotations

from pathlib import Path

_PROC = Path("/proc")
_CGROUP = Path("/sys/fs/cgroup")
_NO_LIMIT = 1 << 60  # cgroup v1 writes its "unlimited" as a number near 2**63


def available_bytes(proc: Path = _PROC, cgroup: Path = _CGROUP) -> int | None:
    """Bytes this process can still allocate, or None when the system does not say."""
    found = [v for v in (_meminfo_available(proc), _cgroup_left(proc, cgroup)) if v is not None]
    return min(found) if found else None


def _meminfo_available(proc: Path) -> int | None:
    for line in _read(proc / "meminfo").splitlines():
        name, _, rest = line.partition(":")
        if name == "MemAvailable":
            fields = rest.split()
            if fields and fields[0].isdigit():
                return int(fields[0]) * (1024 if fields[1:2] == ["kB"] else 1)
    return None


def _cgroup_left(proc: Path, cgroup: Path) -> int | None:
    """The cgroup's limit less its usage (v2: memory.max, v1: memory.limit_in_bytes), for this
    process's own cgroup where it is mounted, else the mount's root (a container's view)."""
    for kind, path in _cgroup_paths(proc):
        for base in (cgroup / path.lstrip("/"), cgroup) if kind == 2 else (
                cgroup / "memory" / path.lstrip("/"), cgroup / "memory"):
            names = ("memory.max", "memory.current") if kind == 2 else (
                "memory.limit_in_bytes", "memory.usage_in_bytes")
            limit, used = (_number(base / n) for n in names)
            if limit is not None and limit < _NO_LIMIT:
                return max(limit - (used or 0), 0)
    return None


def _cgroup_paths(proc: Path) -> list[tuple[int, str]]:
    """(version, path) of this process's memory cgroups, v2 first."""
    found = []
    for line in _read(proc / "self" / "cgroup").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            found.insert(0, (2, parts[2]))
        elif "memory" in parts[1].split(","):
            found.append((1, parts[2]))
    return found


def _number(path: Path) -> int | None:
    text = _read(path).strip()
    return int(text) if text.isdigit() and len(text) < 24 else None


def _read(path: Path) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(1 << 16)
    except OSError:
        return ""
