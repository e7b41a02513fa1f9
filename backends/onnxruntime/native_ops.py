"""dayzero's own ONNX Runtime kernels: a custom-op library built from `native/` with the package.

Why a native kernel at all: every CPU attention kernel ONNX Runtime has (GroupQueryAttention,
MultiHeadAttention, ONNX's Attention) multiplies the whole S x S score matrix of a causal prompt
and masks half of it afterwards, and that wasted half was the largest cost left in the decoder
once its GEMMs ran at the machine's peak (docs/performance.md). `ai.dayzero.CausalAttention`
multiplies each block of queries only with the keys it may see; otherwise it takes GQA's inputs
and attributes (packed or separate q/k/v, half-width rotary caches), minus the length inputs a
prompt without past does not need. `ai.dayzero.PagedAttention` runs `paged_attention` (a
generation step over a paged KV cache) reading each visible key where it lives, instead of the
decomposition's gathers of every token's keys (see convert_paged). `ai.dayzero.MatMulInt4` runs
int4 weights with int8 activations reading fewer bytes per weight than MatMulNBits (see
convert_int4). `ai.dayzero.PackedLinear` runs float32 linear layers on weights packed in panels
of 32 columns, overlapping a decode step's weight stream with its arithmetic where MLAS's
product took turns (see convert_packed_linear).

The library is optional. setup.py builds it where a C++17 compiler exists; where it is absent, or
this onnxruntime refuses it, `kernels()` is empty, the lowering's kernel probe does not offer it,
and attention and int4 weights lower to ORT's own kernels as before (with the usual fallback
warning). An artifact that uses it records that in its node map and also stores a portable
model, the same graph lowered without the native kernels; loading it where the library is
missing runs that one instead, with a `PortableFallbackWarning` naming the kernels (no
re-lowering at load).

This module is on the load path: it imports onnxruntime, never onnx or torch.
"""

from __future__ import annotations

import functools
import importlib.machinery
import warnings
from pathlib import Path

DOMAIN = "ai.dayzero"
LIBRARY = "_dayzero_ort_ops"  # the extension module setup.py builds, next to this file
KERNELS = ((DOMAIN, "CausalAttention", "float"), (DOMAIN, "PagedAttention", "float"),
           (DOMAIN, "MatMulInt4", "float"), (DOMAIN, "PackedLinear", "float"))


class NativeKernelWarning(UserWarning):
    """dayzero's custom-op library exists but this onnxruntime cannot load it."""


class PortableFallbackWarning(UserWarning):
    """An artifact's model uses native kernels this installation cannot run; its portable
    model (the same graph on ONNX Runtime's own kernels) is loaded instead."""


def library_file() -> Path | None:
    """The built library next to this module, whatever Python's extension suffix."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = Path(__file__).with_name(f"{LIBRARY}{suffix}")
        if path.is_file():
            return path
    return None


@functools.lru_cache(maxsize=1)
def library() -> Path | None:
    """The library, when it is built and this onnxruntime accepts it; None otherwise."""
    from .ort_module import ort

    path = library_file()
    if path is None:
        return None
    try:
        ort.SessionOptions().register_custom_ops_library(str(path))
    except Exception as exc:  # ORT raises its own exception types, one per status code
        warnings.warn(f"dayzero's native kernels in {path} do not load into onnxruntime "
                      f"{ort.__version__} ({exc}); attention uses ORT's own kernels",
                      NativeKernelWarning, stacklevel=2)
        return None
    return path


def kernels() -> tuple[tuple[str, str, str], ...]:
    """(domain, op, element type) of each native kernel this installation can run."""
    return KERNELS if library() is not None else ()


def register(options) -> None:
    """Make the native kernels available to sessions created with `options` (if built)."""
    path = library()
    if path is not None:
        options.register_custom_ops_library(str(path))
