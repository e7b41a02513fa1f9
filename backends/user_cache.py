"""The per-user cache folder: where the Triton backend writes its kernel modules and the
torch.compile backend keeps its compiled artifacts.

Both hold things that are later run (kernel source, compiled models), so the folder must belong
to this user and be writable by nobody else: a shared, predictable folder (the old
`/tmp/dayzero_triton`) let another local user swap a file between our check and its use.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from compiler.errors import DayzeroError

CACHE_ENV = "DAYZERO_CACHE_DIR"


def user_cache_dir(kind: str, override: str | os.PathLike | None = None) -> Path:
    """`override`, else `$DAYZERO_CACHE_DIR/<kind>`, else `$XDG_CACHE_HOME/dayzero/<kind>`, else
    `~/.cache/dayzero/<kind>`; created 0700 if missing, refused if it is not this user's own."""
    if override:
        folder = Path(override)
    elif os.environ.get(CACHE_ENV):
        folder = Path(os.environ[CACHE_ENV]) / kind
    else:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        folder = Path(base) / "dayzero" / kind
    folder = folder.expanduser()
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = folder.stat()
    except OSError as exc:
        raise DayzeroError(f"cannot create the {kind} cache folder: {exc}", str(folder),
                           f"set {CACHE_ENV} to a folder you own") from None
    if not stat.S_ISDIR(info.st_mode):
        raise DayzeroError(f"the {kind} cache path is not a folder", str(folder),
                           f"remove it, or set {CACHE_ENV} to a folder you own")
    if info.st_uid != os.getuid():
        raise DayzeroError(f"the {kind} cache folder belongs to user id {info.st_uid}, not to "
                           f"this user ({os.getuid()}), who could then run code it puts there",
                           str(folder), f"set {CACHE_ENV} to a folder you own")
    if info.st_mode & 0o022:
        raise DayzeroError(f"the {kind} cache folder is writable by others (mode "
                           f"{stat.S_IMODE(info.st_mode):o}), who could swap what is run "
                           "from it", str(folder), f"chmod 700 {folder}")
    return folder
