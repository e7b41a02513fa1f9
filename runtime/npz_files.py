"""Arrays to and from .npz files: the exchange format of `dayzero run` and the rank launcher.

Written atomically (a reader never sees half a file) and read without pickle (an .npz may come
from anywhere).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .atomic_files import write_atomically


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Atomic: the file appears complete or not at all."""
    write_atomically(path, lambda f: np.savez(f, **arrays), suffix=".npz.tmp")
