"""Arrays to and from .npz files: the exchange format of `dayzero run` and the rank launcher.

Written atomically (a reader never sees half a file) and read without pickle (an .npz may come
from anywhere).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Atomic: the file appears complete or not at all."""
    fd, tmp = tempfile.mkstemp(dir=path.parent or Path("."), suffix=".npz.tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
