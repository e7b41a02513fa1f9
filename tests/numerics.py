"""What dayzero promises about numbers, written once as the assertions the tests share.

- fp32 through a reordered computation (a fused kernel, another summation order, a decomposition,
  another library's GEMM): max |got - eager| <= 1e-5 x max(1, max |eager|), measured over the
  finite values, and NaN and +-Inf in exactly the places eager has them.
- Exact equality only where the op sequence is identical (a pass that keeps the ops, a round trip
  through a file): those tests compare with `==` and say so.

A relative bound on the largest magnitude, not per element: summation order moves every element
by a few ulps of the values summed, which the largest output bounds and a tiny element does not.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

FP32_REORDERED = 1e-5


def as_array(x) -> np.ndarray:
    """numpy view of a numpy array, torch tensor or scalar (no torch import needed)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def largest_magnitude(arrays: Iterable) -> float:
    """max |x| over the finite values of all `arrays` (0.0 when there are none)."""
    peak = 0.0
    for a in arrays:
        a = as_array(a).astype(np.float64)
        peak = max(peak, float(np.max(np.abs(a[np.isfinite(a)]), initial=0.0)))
    return peak


def fp32_bound(*eager, rel: float = FP32_REORDERED) -> float:
    """The largest error the fp32 promise allows against these eager outputs."""
    return rel * max(1.0, largest_magnitude(eager))


def assert_fp32_close(got, want, *, rel: float = FP32_REORDERED, what: str = "output") -> None:
    """`got` keeps the fp32 promise against eager's `want` (see the module docstring)."""
    got, want = as_array(got), as_array(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, eager {want.shape}"
    g, w = got.astype(np.float64), want.astype(np.float64)
    nan_got, nan_want = np.isnan(g), np.isnan(w)
    assert np.array_equal(nan_got, nan_want), (
        f"{what}: NaN at {np.argwhere(nan_got != nan_want)[:5].tolist()} differs from eager")
    inf_got, inf_want = np.isinf(g), np.isinf(w)
    assert np.array_equal(inf_got, inf_want) and np.array_equal(g[inf_got], w[inf_want]), (
        f"{what}: +-Inf at {np.argwhere(inf_got != inf_want)[:5].tolist()} differs from eager")
    finite = np.isfinite(w)
    err = float(np.max(np.abs(g[finite] - w[finite]), initial=0.0))
    bound = fp32_bound(want, rel=rel)
    assert err <= bound, f"{what}: max |got - eager| = {err:.3g} > {bound:.3g}"
