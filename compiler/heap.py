"""Handing the C heap's free pages back to the system (glibc's `malloc_trim`).

glibc keeps what freed buffers leave in its heaps and per-thread arenas, so without a trim a
process keeps the pages of its busiest moment: ONNX Runtime's load, whose constant folding reads
each stored weight, writes its repacked copy and frees the original (dayzero's PackedLinear and
MatMulInt4 layouts), left an fp32 decoder at twice its weights; a serving step's buffers come and
go from several threads. Trimming after such moments keeps RSS at what the process holds. With
another C library it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util


def _glibc_trim():
    """glibc's malloc_trim, or None (another C library, or none found)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _glibc_trim()


def trim_heap() -> None:
    """Return the C heap's free pages to the system."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
