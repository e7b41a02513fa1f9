"""Error metrics between a backend's tensor and the reference's, computed in float64.

- max abs error: max |got - ref|.
- max rel error: max |got - ref| / (|ref| + atol): relative where the reference is large, and
  bounded where it is near zero (a plain ratio explodes on values that are ~0 in both).
- cosine similarity of the flattened tensors (1.0 when both are all zero).
- worst: max |got - ref| / (atol + rtol * |ref|), the allclose criterion as a ratio: <= 1 passes.
- mismatched: elements outside the allclose bound (for integers and bools: unequal elements).
NaN where both are NaN counts as equal; a NaN or inf on one side only is an infinite error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .thresholds import Threshold


@dataclass(frozen=True)
class Errors:
    max_abs: float
    max_rel: float
    cosine: float
    worst: float
    mismatched: int
    size: int

    def passes(self, threshold: Threshold) -> bool:
        """Within the allclose bound everywhere, and aligned in direction unless the whole
        tensor is within atol (the direction of values that are ~0 is noise)."""
        return self.worst <= 1.0 and (self.cosine >= threshold.cosine
                                      or self.max_abs <= threshold.atol)


def compare(got: np.ndarray, ref: np.ndarray, threshold: Threshold) -> Errors:
    """Errors of `got` against `ref` (same shape, any dtypes) under `threshold`."""
    got = np.asarray(got)
    ref = np.asarray(ref)
    if got.dtype.kind in "biu" and ref.dtype.kind in "biu":
        unequal = int(np.count_nonzero(got != ref))
        diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
        max_abs = float(diff.max()) if diff.size else 0.0
        return Errors(max_abs, max_abs, 1.0 if unequal == 0 else 0.0,
                      float("inf") if unequal else 0.0, unequal, int(ref.size))
    g = got.astype(np.float64)
    r = ref.astype(np.float64)
    with np.errstate(invalid="ignore"):  # inf - inf: handled just below
        diff = np.abs(g - r)
    both_nan = np.isnan(g) & np.isnan(r)
    same_inf = np.isinf(g) & (g == r)
    diff = np.where(both_nan | same_inf, 0.0, diff)
    diff = np.where(np.isnan(diff), np.inf, diff)
    bound = threshold.atol + threshold.rtol * np.abs(np.where(np.isfinite(r), r, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        worst = np.where(diff == 0, 0.0, diff / bound)
        rel = diff / (np.abs(np.where(np.isfinite(r), r, 0.0)) + max(threshold.atol, 1e-30))
    size = int(r.size)
    if size == 0:
        return Errors(0.0, 0.0, 1.0, 0.0, 0, 0)
    return Errors(float(diff.max()), float(rel.max()), cosine(g, r), float(worst.max()),
                  int(np.count_nonzero(worst > 1.0)), size)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = np.nan_to_num(a.reshape(-1), nan=0.0, posinf=0.0, neginf=0.0)
    b = np.nan_to_num(b.reshape(-1), nan=0.0, posinf=0.0, neginf=0.0)
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.clip(np.dot(a, b) / (na * nb), -1.0, 1.0))
