"""Weight data as passes see it: a tensor in memory, or a lazy handle that reads it on demand.

`graph.weight_data` maps a weight's name to its data: a torch tensor or numpy array, or a lazy
handle whose bytes still lie elsewhere (a checkpoint shard read through mmap, a quantization
computed when the artifact writer reaches it). The passes that touch weight data (precision,
quantize_weights, the horizontal merge of fusion) use only this module, so no pass imports the
checkpoint loader that makes the handles: the loader's handles implement `LazyWeight`.

Dtype conversion of weights lives here too, checked for overflow: converting a checkpoint's
weights (bf16 -> fp16, say) is where a Day-0 model silently breaks, since fp16's range ends at
65504 and a finite 1e5 becomes inf, turning every output to NaN far from the cause. Every
narrowing conversion is checked and an overflowing weight is named.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

from ..errors import DayzeroError
from .dtypes import DType

# (weight [N, K], bits, group_size) -> (codes, scales): what `quantize_lazily` defers
Quantizer = Callable[[Any, int, int], tuple[Any, Any]]


@runtime_checkable
class LazyWeight(Protocol):
    """Weight data not read yet; it is read when a pass needs the values or the writer streams
    it, one tensor at a time, so a model bigger than memory still compiles."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def ir_dtype(self) -> DType:
        """The dtype of the data the handle yields (after any deferred conversion)."""

    def load(self) -> Any:
        """The whole tensor, read now, as a new torch tensor of `ir_dtype`."""

    def iter_chunks(self, chunk_bytes: int = ...) -> Iterator[memoryview]:
        """Its raw little-endian bytes, a bounded chunk at a time (the artifact writer's path)."""

    def concat_rows_lazily(self, rest: Sequence[LazyWeight]) -> LazyWeight | None:
        """This handle and `rest` concatenated along dim 0, nothing read; None if they
        cannot be (another dtype or trailing shape, or handles of another kind)."""

    def quantize_lazily(self, bits: int, group_size: int, quantize: Quantizer,
                        shapes: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
                        scale_dtype: DType | None = None) -> tuple[LazyWeight, LazyWeight]:
        """Handles of `quantize(self.load(), bits, group_size)`'s codes and scales, computed
        when the first of them is read. `shapes` are theirs where `quantize` is not the
        [N, K] rule (an expert stack's codes keep the expert axis); `scale_dtype` is the
        scales' where it is not this weight's."""

    def map_lazily(self, fn: Callable[[Any], Any], shape: tuple[int, ...],
                   dtype: DType) -> LazyWeight:
        """A handle of `fn(self.load())`, a tensor of `shape` and `dtype`, computed each time
        it is read (nothing is read now): a constant folded from this weight alone."""


@runtime_checkable
class ConvertibleLazily(LazyWeight, Protocol):
    """A lazy handle that can convert its dtype while it streams."""

    def astype_lazy(self, dtype: DType) -> LazyWeight:
        """The same data, to be converted to `dtype` when read (nothing is read now)."""


class WeightOverflowError(DayzeroError):
    """A weight's finite values do not fit the dtype it is converted to."""


def is_lazy(data: Any) -> bool:
    """Whether `data` is a lazy handle (not read yet) rather than a tensor in memory."""
    return isinstance(data, LazyWeight)


def concat_rows(parts: Sequence[Any]) -> Any:
    """`torch.cat(parts, dim=0)`, lazily when every part is a lazy handle that can: a merged
    weight then streams like any other instead of being held in memory."""
    if parts and all(is_lazy(p) for p in parts):
        merged = parts[0].concat_rows_lazily(parts[1:])
        if merged is not None:
            return merged
    import torch

    return torch.cat([torch.as_tensor(p) for p in parts], dim=0)


def convert_weight(data: Any, target: DType, name: str) -> Any:
    """A weight's data as `target`: lazy handles convert when streamed, tensors right away."""
    if isinstance(data, ConvertibleLazily):
        return data.astype_lazy(target)
    import torch

    tensor = torch.as_tensor(data)
    if DType.from_torch(tensor.dtype) == target:
        return tensor
    return convert(tensor, target, name)


def convert(tensor: Any, target: DType, name: str) -> Any:
    """`tensor` (torch) as `target`, always a new tensor; raises if a finite value overflows."""
    import torch

    out = tensor.to(target.to_torch(), copy=True)
    source = DType.from_torch(tensor.dtype)
    if may_overflow(source, target) and bool(torch.isinf(out).any()):
        check_overflow(tensor, out, name, target)
    return out


def may_overflow(source: DType, target: DType) -> bool:
    """Whether some finite `source` values are out of `target`'s range."""
    return source != target and _MAX[target] < _MAX[source]


def check_overflow(source: Any, converted: Any, name: str, target: DType) -> None:
    """Raise naming `name` if finite values of `source` became inf in `converted`."""
    import torch

    bad = torch.isinf(converted) & torch.isfinite(source)
    count = int(bad.sum())
    if count:
        largest = float(source[bad].abs().max())
        raise overflow_error(name, target, count, largest)


def overflow_error(name: str, target: DType, count: int, largest: float) -> WeightOverflowError:
    return WeightOverflowError(
        f"weight '{name}' does not fit {target}: {count} finite value(s) overflow to inf "
        f"(largest magnitude {largest:.6g}, {target} max {_MAX[target]:.6g})", f"weight {name}",
        "keep this checkpoint's weights in bf16 or fp32 (precision.weight_dtype), or rescale "
        "the weight before converting")


_MAX = {DType.f64: 1.7976931348623157e308, DType.f32: 3.4028234663852886e38,
        DType.bf16: 3.3895313892515355e38, DType.f16: 65504.0}
