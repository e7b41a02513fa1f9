"""How close a backend's value must be to the reference's, by op class and dtype, as data.

A value passes when every element satisfies |got - ref| <= atol + rtol * |ref| (numpy's allclose)
and the cosine similarity of the two tensors is at least `cosine`. Values are compared as
computed, so errors accumulate along the graph: the thresholds allow the rounding of a few
dozen layers in the value's dtype, not just of the one op.

Norms, softmax and attention are stricter: their outputs are normalized (unit scale, or
probabilities in [0, 1]), so an error there is large relative to the value and is usually a
wrong epsilon, axis or mask rather than rounding. Integer and bool values must match exactly.
The dtype that picks the row is the value's *precision*: the narrowest float dtype on its way
from the inputs and weights (an f32 norm of f16 activations is as exact as f16, not f32).
`--atol` / `--rtol` replace the table's atol / rtol for every float value.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Threshold:
    atol: float
    rtol: float
    cosine: float

    def describe(self) -> str:
        return f"atol {self.atol:g} rtol {self.rtol:g} cos {self.cosine:g}"


EXACT = Threshold(0.0, 0.0, 1.0)

# class -> dtype -> threshold. f32 allows the reordering of sums a different kernel library
# does; f16 and bf16 allow a few units of their epsilon (2^-10, 2^-7) after accumulation.
THRESHOLDS: dict[str, dict[str, Threshold]] = {
    "default": {
        "f64": Threshold(1e-8, 1e-7, 0.9999999),
        "f32": Threshold(1e-4, 1e-3, 0.99999),
        "f16": Threshold(3e-2, 3e-2, 0.999),
        "bf16": Threshold(1.5e-1, 1e-1, 0.99),
    },
    "strict": {
        "f64": Threshold(1e-9, 1e-8, 0.99999999),
        "f32": Threshold(2e-5, 2e-4, 0.999999),
        "f16": Threshold(1e-2, 1e-2, 0.9995),
        "bf16": Threshold(6e-2, 5e-2, 0.995),
    },
}

# op or op kind -> class; ops are looked up before kinds
CLASSES: dict[str, str] = {
    "softmax": "strict",
    "log_softmax": "strict",
    "normalization": "strict",  # layer_norm, rms_norm, group_norm, batch_norm
    "attention": "strict",  # scaled_dot_product_attention
    "add_rms_norm": "strict",
    "add_layer_norm": "strict",
}

_FALLBACK_DTYPE = "f32"  # 8-bit floats and anything unlisted: f32's table scaled below
_NARROW_SCALE = {"f8e4m3": 8.0, "f8e5m2": 16.0}


# float dtypes by mantissa bits: a value computed from narrower inputs carries their rounding
MANTISSA = {"f64": 52, "f32": 23, "f16": 10, "bf16": 7, "f8e4m3": 3, "f8e5m2": 2}


def narrowest(dtypes) -> str | None:
    """The float dtype with the fewest mantissa bits among `dtypes` (None if none is float)."""
    floats = [d for d in dtypes if d in MANTISSA]
    return min(floats, key=MANTISSA.__getitem__) if floats else None


def op_class(op: str, kind: str) -> str:
    return CLASSES.get(op, CLASSES.get(kind, "default"))


def threshold_for(op: str, kind: str, dtype: str, atol: float | None = None,
                  rtol: float | None = None) -> Threshold:
    """The threshold for a value of `dtype` produced by `op` (of `kind`), with overrides."""
    if dtype in ("bool",) or dtype.startswith(("i", "u")):
        return EXACT
    table = THRESHOLDS[op_class(op, kind)]
    base = table.get(dtype)
    if base is None:
        scale = _NARROW_SCALE.get(dtype, 1.0)
        wide = table["bf16" if dtype in _NARROW_SCALE else _FALLBACK_DTYPE]
        base = Threshold(wide.atol * scale, wide.rtol * scale, wide.cosine)
    return Threshold(base.atol if atol is None else atol, base.rtol if rtol is None else rtol,
                     base.cosine)
