"""Several static sizes in one artifact, for a dim torch.export can only trace as a constant.

State-space and recurrent models (Mamba, RWKV, RecurrentGemma, Jamba) unroll or specialise
their sequence loop: torch.export's suggested fix is `seq = 16`, so no dynamic graph exists. The
driver then compiles the model once per size and writes one artifact: the example's size at the
top (an ordinary artifact any reader can use at that size) and each other size as a complete
artifact under `sizes/<dim>-<size>/`. The manifest's `static_sizes` section says which inputs'
axes carry the dim and where each size's artifact is; `runtime.load` gives a model that runs
the one compiled for the inputs' size.

A size between the compiled ones runs padded, where the model allows it: padding on the right
up to the next compiled size, then cutting the outputs back, is exact only if no output
position before the padding reads it (a causal model: a recurrent scan carries its state
forward only). `right_padding` checks that on the eager model before compiling: the example
padded with two different contents must leave every output's first positions as they are, and
every output must carry the dim on one axis or not depend on it. Where that holds, the manifest
lists the outputs' axes to cut (`static_sizes.padding`) and the runtime pads; otherwise only
exact sizes run, and any other size is refused with the list of compiled ones.
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
            reason: str, padding: list[list[int]] | None = None) -> dict[str, Any]:
    """The manifest's `static_sizes` entry: the dim, which (input position, axis) pairs carry
    it, each size's artifact folder ("." for the top one), and, where right-padding is safe,
    the [output, axis] pairs the runtime cuts back."""
    entry = {"dim": dim, "reason": reason,
             "inputs": [[position, axis] for position, axis in axes],
             "sizes": [{"size": n, "path": "." if n == example else variant_dir(dim, n)}
                       for n in sizes]}
    if padding is not None:
        entry["padding"] = {"side": "right", "outputs": padding}
    return entry


PAD_EXTRA = 3  # positions added to the example by the padding check


def right_padding(model: torch.nn.Module, example_inputs: tuple, axes: list[tuple[int, int]],
                  example: int) -> list[list[int]] | None:
    """[output, axis] for each output that carries the dim, when padding the dim on the right
    (with any contents: two are tried) leaves the outputs' first `example` positions unchanged;
    None when it does not (the padding reaches earlier positions, or an output without the dim
    changes)."""
    import torch.utils._pytree as pytree

    if any(p.device.type == "meta" for p in model.parameters()):
        return None  # a checkpoint's model has no values to check with

    def run(inputs):
        with torch.no_grad():
            return [t for t in pytree.tree_leaves(model(*inputs)) if isinstance(t, torch.Tensor)]

    base = run(example_inputs)
    longer = resized(example_inputs, axes, example + PAD_EXTRA)
    other = list(longer)
    for position, axis in axes:  # the same length, the padded positions in reverse order
        x = other[position]
        tail = x.narrow(axis, example, PAD_EXTRA).flip(axis)
        other[position] = torch.cat([x.narrow(axis, 0, example), tail], dim=axis)
    cut: list[list[int]] = []
    for padded in (run(longer), run(tuple(other))):
        if len(padded) != len(base):
            return None
        for i, (want, got) in enumerate(zip(base, padded)):
            axis = _carrying_axis(want.shape, got.shape, example)
            if axis is False:
                return None
            prefix = got if axis is None else got.narrow(axis, 0, example)
            if not torch.allclose(prefix.double(), want.double(), rtol=1e-5, atol=1e-6,
                                  equal_nan=True):
                return None
            if axis is not None and [i, axis] not in cut:
                cut.append([i, axis])
    return cut


def _carrying_axis(short: torch.Size, long: torch.Size, example: int) -> int | None | bool:
    """The one axis along which an output grew by the padding; None if it did not grow; False
    if it grew otherwise (several axes, or by another amount)."""
    if len(short) != len(long):
        return False
    grown = [k for k, (a, b) in enumerate(zip(short, long)) if a != b]
    if not grown:
        return None
    k = grown[0]
    return k if len(grown) == 1 and short[k] == example and long[k] == example + PAD_EXTRA \
        else False


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
    padding = right_padding(model, example_inputs, axes, example)
    if padding is None:
        reason = (f"torch.export finds no graph dynamic in {dim}; padding changes earlier "
                  "positions' outputs, so only these exact sizes run")
    else:
        reason = (f"torch.export finds no graph dynamic in {dim}; a size between them runs "
                  "padded on the right to the next one (checked: padding leaves earlier "
                  "positions' outputs unchanged)")
    log.line(f"  {reason}")
    entry = {"static_sizes": section(dim, axes, chosen, example, reason, padding)}
    return compile_fn(model, example_inputs, out, dynamic_shapes=static, log=log,
                      report=report, _bundle=(files, entry), **options)
