"""Files written atomically: a reader (or a crash) never sees half a file.

The content goes to a temporary file in the destination's folder, then `os.replace` puts it in
place in one step; on any failure the temporary file is removed.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_atomically(path: Path, write: Callable[[BinaryIO], None], prefix: str = "tmp",
                     suffix: str = ".tmp") -> None:
    """Call `write` on a temporary file beside `path` (named prefix + random + suffix), then
    move it to `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent or Path("."), prefix=prefix, suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
