"""Several static sizes in one artifact, for a dim torch.export can only trace as a constant.

State-space and recurrent models (Mamba, RWKV, RecurrentGemma, Jamba) unroll or specialise
their sequence loop: torch.export's suggested fix is `seq = 16`, so no dynamic graph exists. The
driver then compiles the model once per size and writes one artifact: the example's size at the
top (an ordinary artifact any reader can use at that size) and each other size as a complete
artifact under `sizes/<dim>-<size>/`. The manifest's `static_sizes` section says which inputs'
axes carry the dim and where each size's artifact is; `runtime.load` gives a model that runs
the one compiled for the inputs' size.

Padding a smaller input up to a compiled size is not done: nothing in the graph proves that
the padded positions cannot change the others (a recurrent state reads every position), so
only exact sizes run, and any other size is refused with the list of compiled ones.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from .errors import DayzeroError
from .frontend.refine import SpecializedDims, axes_of
from .log import StageLog

# Sizes picked when the caller gives none: the example's and its nearest powers of two.
DEFAULT_COUNT = 4
SIZES_DIR = "sizes"


def dim_range(dynamic_shapes: Any, dim: str) -> tuple[int, int | None]:
    """The [min, max] the user gave the Dim `dim` (max None: unbounded)."""
    for leaf in _leaves(dynamic_shapes):
        if getattr(leaf, "__name__", None) == dim:
            hi = getattr(leaf, "max", None)
            hi = hi if isinstance(hi, int) and hi < 2 ** 31 else None
            lo = getattr(leaf, "min", None)
            return (lo if isinstance(lo, int) else 0), hi
    return 0, None


def choose_sizes(example: int, lo: int, hi: int | None, count: int = DEFAULT_COUNT) -> list[int]:
    """The example's size and the powers of two in [lo, hi] nearest to it (by ratio)."""
    top = hi if hi is not None else example * 2 ** count
    powers = [2 ** k for k in range(0, int(math.log2(max(top, 1))) + 1)
              if lo <= 2 ** k <= top and 2 ** k != example]
    powers.sort(key=lambda p: (abs(math.log2(p / example)), p))
    return sorted([example, *powers[:count - 1]])


def resized(inputs: Sequence[Any], axes: list[tuple[int, int]], size: int) -> tuple:
    """The example inputs with every listed axis cut or repeated to `size` (values stay ones
    the model saw, so token ids stay inside the vocabulary)."""
    out = list(inputs)
    for position, axis in axes:
        x = out[position]
        have = x.shape[axis]
        if size > have:
            x = torch.cat([x] * math.ceil(size / have), dim=axis)
        out[position] = x.narrow(axis, 0, size).contiguous()
    return tuple(out)


def without_dim(dynamic_shapes: Any, dim: str) -> Any:
    """`dynamic_shapes` with the Dim `dim` made static wherever it appears."""
    if isinstance(dynamic_shapes, dict):
        return {k: without_dim(v, dim) for k, v in dynamic_shapes.items()}
    if isinstance(dynamic_shapes, (list, tuple)):
        return type(dynamic_shapes)(without_dim(v, dim) for v in dynamic_shapes)
    if getattr(dynamic_shapes, "__name__", None) == dim:
        return torch.export.Dim.STATIC
    return dynamic_shapes


def section(dim: str, axes: list[tuple[int, int]], sizes: list[int], example: int,
            reason: str) -> dict[str, Any]:
    """The manifest's `static_sizes` entry: the dim, which (input position, axis) pairs carry
    it, and each size's artifact folder ("." for the top one)."""
    return {"dim": dim, "reason": reason,
            "inputs": [[position, axis] for position, axis in axes],
            "sizes": [{"size": n, "path": "." if n == example else variant_dir(dim, n)}
                      for n in sizes]}


def variant_dir(dim: str, size: int) -> str:
    return f"{SIZES_DIR}/{dim}-{size}"


def artifact_files(root: Path, prefix: str) -> dict[str, bytes]:
    """Every file of a written artifact, keyed by its path under `prefix`."""
    return {f"{prefix}/{p.relative_to(root).as_posix()}": p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def check_sizes(sizes: Sequence[int], lo: int, hi: int | None, dim: str) -> list[int]:
    """The caller's sizes, checked against the Dim's range."""
    bad = [n for n in sizes if not isinstance(n, int) or n < max(lo, 1)
           or (hi is not None and n > hi)]
    if bad or not sizes:
        raise DayzeroError(f"static_sizes {list(sizes)} for {dim}: each must be an int in "
                           f"[{max(lo, 1)}, {hi if hi is not None else 'inf'}]",
                           "static_sizes", f"give sizes inside the range of Dim '{dim}'")
    return sorted(set(sizes))


def _leaves(spec: Any) -> list[Any]:
    if isinstance(spec, dict):
        return [x for v in spec.values() for x in _leaves(v)]
    if isinstance(spec, (list, tuple)):
        return [x for v in spec for x in _leaves(v)]
    return [spec]


def compile_sizes(compile_fn: Callable[..., Path], model: torch.nn.Module, example_inputs: tuple,
                  dynamic_shapes: Any, exc: SpecializedDims, out: Path,
                  sizes: Sequence[int] | None, log: StageLog, **options: Any) -> Path:
    """One artifact holding the model compiled (by `compile_fn`, the driver's `compile`) at
    several static sizes of the dim torch.export fixed to a constant: the example's size at the
    top, the others under sizes/."""
    (dim, example), = exc.sizes.items()
    lo, hi = dim_range(dynamic_shapes, dim)
    chosen = check_sizes(sizes, lo, hi, dim) if sizes else choose_sizes(example, lo, hi)
    chosen = sorted({*chosen, example})
    axes = axes_of(model, dynamic_shapes, dim)
    static = without_dim(dynamic_shapes, dim)
    log.line(f"  torch.export finds no graph dynamic in {dim} (the example has {dim} = "
             f"{example}); compiling static sizes {dim} = {', '.join(map(str, chosen))}")
    files: dict[str, bytes] = {}
    report = options.pop("report", None)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.sizes-") as tmp:
        for n in chosen:
            if n != example:
                path = compile_fn(model, resized(example_inputs, axes, n), Path(tmp) / str(n),
                                  dynamic_shapes=static, log=log, _bundle=({}, {}), **options)
                files.update(artifact_files(path, variant_dir(dim, n)))
    reason = (f"torch.export finds no graph dynamic in {dim}; padding is not proven safe, so "
              "only these exact sizes run")
    entry = {"static_sizes": section(dim, axes, chosen, example, reason)}
    return compile_fn(model, example_inputs, out, dynamic_shapes=static, log=log,
                      report=report, _bundle=(files, entry), **options)
