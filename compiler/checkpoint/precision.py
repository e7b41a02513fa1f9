"""Weight dtype conversion with overflow checks, shared by the streaming reader and the passes.

Converting a checkpoint's weights (fp32 <-> bf16 <-> fp16) is where a Day-0 model silently
breaks: fp16's range ends at 65504, so a finite bf16 weight of 1e5 becomes inf and every output
turns to NaN much later, far from the cause. Every narrowing conversion here is checked and a
weight that overflows is named, with how many of its values overflow and the largest magnitude.
"""

from __future__ import annotations

from typing import Any

from compiler.ir import DType

from .layout import CheckpointError

# the `precision:` config's names -> IR dtypes (fp8 is a quantization format, not handled here)
CONFIG_DTYPES: dict[str, DType] = {"fp32": DType.f32, "bf16": DType.bf16, "fp16": DType.f16}
CONVERTIBLE = frozenset({DType.f64, DType.f32, DType.bf16, DType.f16})


def convertible(source: DType, target: DType) -> bool:
    """Whether a weight stored as `source` may be mapped to `target` by the precision config."""
    return source == target or (source in CONVERTIBLE and target in CONVERTIBLE)


def may_overflow(source: DType, target: DType) -> bool:
    """Whether some finite `source` values are out of `target`'s range."""
    return source != target and _MAX[target] < _MAX[source]


def convert(tensor: Any, target: DType, name: str) -> Any:
    """`tensor` (torch) as `target`, always a new tensor; raises if a finite value overflows."""
    import torch

    out = tensor.to(target.to_torch(), copy=True)
    source = DType.from_torch(tensor.dtype)
    if may_overflow(source, target) and bool(torch.isinf(out).any()):
        check_overflow(tensor, out, name, target)
    return out


def check_overflow(source: Any, converted: Any, name: str, target: DType) -> None:
    """Raise naming `name` if finite values of `source` became inf in `converted`."""
    import torch

    bad = torch.isinf(converted) & torch.isfinite(source)
    count = int(bad.sum())
    if count:
        largest = float(source[bad].abs().max())
        raise overflow_error(name, target, count, largest)


def overflow_error(name: str, target: DType, count: int, largest: float) -> CheckpointError:
    return CheckpointError(
        f"weight '{name}' does not fit {target}: {count} finite value(s) overflow to inf "
        f"(largest magnitude {largest:.6g}, {target} max {_MAX[target]:.6g})", f"weight {name}",
        "keep this checkpoint's weights in bf16 or fp32 (precision.weight_dtype), or rescale "
        "the weight before converting")


def convert_weight(data: Any, target: DType, name: str) -> Any:
    """A weight's data as `target`: lazy handles convert when streamed, tensors right away."""
    if hasattr(data, "astype_lazy"):
        return data.astype_lazy(target)
    import torch

    tensor = torch.as_tensor(data)
    if DType.from_torch(tensor.dtype) == target:
        return tensor
    return convert(tensor, target, name)


_MAX = {DType.f64: 1.7976931348623157e308, DType.f32: 3.4028234663852886e38,
        DType.bf16: 3.3895313892515355e38, DType.f16: 65504.0}
