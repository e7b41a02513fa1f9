"""Block-scaled FP8 checkpoints (DeepSeek-V3's release layout), dequantized as they stream.

Such a folder's config.json says `quantization_config: {quant_method: "fp8", weight_block_size:
[128, 128]}`, and each quantized linear weight `X.weight` is stored as float8_e4m3fn next to
`X.weight_scale_inv` (f32, one value per block of 128 x 128: [ceil(rows / 128), ceil(cols /
128)]). The value a weight stands for is its fp8 value times its block's scale_inv (the name is
the inverse of the quantizer's scale; DeepSeek's own `weight_dequant` multiplies by it).

`attach_scales` folds each scale into its weight's record when the layout is read: the record's
`dtype` becomes the dequantized value's (f32, then mapped by the precision config like any other
weight), `stored` keeps the fp8 dtype of its bytes, `scale` the scale tensor's record. The scale
tensors then are no tensors of their own, so names match the model as for any checkpoint.
`BlockDequantized` is the lazy handle the reader makes of such a record: it reads the weight and
its scales (one weight at a time) when the writer reaches it. transformers' model classes built
from the config are not quantized (only from_pretrained applies a quantizer), so the model
expects the float weights this gives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from compiler.ir import DType

from . import precision
from .layout import CheckpointError, TensorRecord
from .lazy import CHUNK_BYTES, LazyTensor, _Lazy, byte_chunks

SCALE_SUFFIX = "_scale_inv"


def block_size(config: dict[str, Any]) -> tuple[int, int] | None:
    """The (rows, cols) of one scale block, when config.json declares block-scaled FP8."""
    quant = config.get("quantization_config")
    if not isinstance(quant, dict) or quant.get("quant_method") != "fp8":
        return None
    block = quant.get("weight_block_size")
    if not (isinstance(block, (list, tuple)) and len(block) == 2
            and all(isinstance(b, int) and b > 0 for b in block)):
        raise CheckpointError(f"quantization_config.weight_block_size is {block!r}: block-scaled "
                              "FP8 needs two positive ints", "config.json "
                              "quantization_config.weight_block_size",
                              "set it to the block of the scale_inv tensors, e.g. [128, 128]")
    return int(block[0]), int(block[1])


def attach_scales(config: dict[str, Any], tensors: dict[str, TensorRecord],
                  where: str) -> dict[str, TensorRecord]:
    """`tensors` with every fp8 weight that has a `<name>_scale_inv` carrying it (and the scale
    records gone); unchanged when the config declares no block-scaled FP8."""
    block = block_size(config)
    if block is None:
        return tensors
    out = dict(tensors)
    for name, record in tensors.items():
        scale = tensors.get(name + SCALE_SUFFIX)
        if record.dtype != DType.f8e4m3 or scale is None:
            continue
        rows, cols = (record.shape[0], record.shape[1]) if len(record.shape) == 2 else (0, 0)
        wanted = (-(-rows // block[0]), -(-cols // block[1]))
        if len(record.shape) != 2 or tuple(scale.shape) != wanted or not scale.dtype.is_float:
            raise CheckpointError(
                f"FP8 weight '{name}' {list(record.shape)} has scales '{scale.name}' "
                f"{scale.dtype}{list(scale.shape)}; blocks of {list(block)} need float "
                f"{list(wanted)}", f"{where}/{scale.file}",
                "use the scales the checkpoint was quantized with (or fix weight_block_size)")
        out[name] = dataclasses.replace(record, dtype=DType.f32, stored=record.dtype,
                                        scale=scale, block=block)
        del out[scale.name]
    return out


class BlockDequantized(LazyTensor):
    """An fp8 weight times its block scales, as `ir_dtype`, computed when read (the record is
    one `attach_scales` made: its `dtype` is f32, the dequantized value's)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return (f"BlockDequantized({self.record.name}: {self.ir_dtype}{list(self.shape)}, "
                f"fp8 blocks of {list(self.record.block)}, {self.record.file})")

    def load(self) -> Any:
        return _Lazy.load(self)

    def iter_chunks(self, chunk_bytes: int = CHUNK_BYTES) -> Iterator[memoryview]:
        stats = self._stats
        for chunk in self._chunks(chunk_bytes):
            yield chunk
            stats.bytes_written += chunk.nbytes
        stats.bytes_read += self.record.nbytes + self.record.scale.nbytes
        stats.tensors += 1
        stats.conversions[(DType.f8e4m3.value, self.ir_dtype.value)] += 1

    def dequantized(self) -> Any:
        """The weight as f32: each fp8 value times the scale of its block."""
        raw = dataclasses.replace(self.record, dtype=self.record.stored, stored=None,
                                  scale=None, block=None)
        weight = self.reader.tensor(raw).float()
        scale = self.reader.tensor(self.record.scale).float()
        rows, cols = weight.shape
        (block_rows, block_cols) = self.record.block
        scale = scale.repeat_interleave(block_rows, 0)[:rows].repeat_interleave(block_cols, 1)
        return weight * scale[:, :cols]

    def _chunks(self, chunk_bytes: int) -> Iterator[memoryview]:
        yield from byte_chunks(precision.convert(self.dequantized(), self.ir_dtype,
                                                 self.record.name), chunk_bytes)
