"""Which dtypes a checkpoint's weights may be mapped to by the `precision:` config.

The conversion itself, checked for overflow, is `compiler.ir.weights`' (the passes convert
weights in memory with it, the streaming reader chunk by chunk); it is re-exported here.
"""

from __future__ import annotations

from compiler.ir import DType
from compiler.ir.weights import (  # noqa: F401  (re-exported: the reader's conversion)
    check_overflow,
    convert,
    convert_weight,
    may_overflow,
    overflow_error,
)

# the `precision:` config's names -> IR dtypes (fp8 is a quantization format, not handled here)
CONFIG_DTYPES: dict[str, DType] = {"fp32": DType.f32, "bf16": DType.bf16, "fp16": DType.f16}
CONVERTIBLE = frozenset({DType.f64, DType.f32, DType.bf16, DType.f16})


def convertible(source: DType, target: DType) -> bool:
    """Whether a weight stored as `source` may be mapped to `target` by the precision config."""
    return source == target or (source in CONVERTIBLE and target in CONVERTIBLE)
