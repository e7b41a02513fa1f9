"""What a size expression can be, given its symbols' ranges: its bounds, and its Max/Min
decided where the ranges decide them.

A model's Python `max(0, 128 - seq)` reaches the exported graph as Max(0, 128 - s0); with seq
exported up to 64 that is 128 - s0 everywhere, and keeping it as Max would make a slice start
unprovable and every shape after it carry the Max.
"""

from __future__ import annotations

import math

import sympy


def bounds(e, ranges) -> tuple[float, float]:
    """Smallest and largest value of an int or a size expression affine in its symbols, given
    their ranges (+-inf where a range is open or the expression is not affine)."""
    if isinstance(e, int) or e.is_Integer:
        return int(e), int(e)
    poly = e.as_poly(*sorted(e.free_symbols, key=str)) if e.free_symbols else None
    if poly is None or poly.total_degree() > 1:
        return -math.inf, math.inf
    lo = hi = float(poly.coeff_monomial(1))
    for sym in poly.gens:
        coeff = float(poly.coeff_monomial(sym))
        low, high = ranges.get(str(sym), (1, None))
        far = math.copysign(math.inf, coeff) if high is None else coeff * high
        ends = (coeff * low, far)
        lo, hi = lo + min(ends), hi + max(ends)
    return lo, hi


def decide_extrema(e, ranges):
    """`e` with each Max/Min whose winner the symbols' ranges decide replaced by that argument
    (an undecided one stays)."""
    if not isinstance(e, sympy.Basic) or not e.has(sympy.Max, sympy.Min):
        return e

    def decided(node):
        args = [decide_extrema(a, ranges) for a in node.args]
        spans = [bounds(a, ranges) for a in args]
        for i, (arg, (lo, hi)) in enumerate(zip(args, spans)):
            others = spans[:i] + spans[i + 1:]
            if isinstance(node, sympy.Max) and all(lo >= o_hi for _, o_hi in others):
                return arg
            if isinstance(node, sympy.Min) and all(hi <= o_lo for o_lo, _ in others):
                return arg
        return node.func(*args)

    return e.replace(lambda x: isinstance(x, (sympy.Max, sympy.Min)), decided)


