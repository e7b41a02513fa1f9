"""`F.interpolate` (nearest, bilinear) as the IR's `resize` to the size torch computed."""

from __future__ import annotations

from ..emitter import AtenEmitter, Unsupported
from .table import converts


def _check_scales(em: AtenEmitter, a, scales: list) -> list:
    """The output's spatial sizes; given scale factors must be exact (in * scale == out)."""
    x = a.get("input", a.get("self"))
    size = em.out_shape()[2:]
    for dim, out, scale in zip(x.shape[2:], size, scales):
        if scale is None:
            continue
        if not (isinstance(dim, int) and isinstance(out, int) and dim * scale == out):
            raise Unsupported(f"interpolate with scale factor {scale} from size {dim} to {out} "
                              "(torch samples by the factor, not the sizes); pass size= instead")
    return size


def _scales(a, names: tuple[str, ...]) -> list:
    if "scale_factors" in a:
        return list(a["scale_factors"] or [None] * len(names))
    return [a.get(n) for n in names]


@converts("upsample_bilinear2d.vec", "upsample_bilinear2d.default", ir="resize")
def _bilinear(em: AtenEmitter, a):
    x = a.get("input", a.get("self"))
    size = _check_scales(em, a, _scales(a, ("scales_h", "scales_w")))
    return em.op("resize", x, size=size, mode="bilinear", align_corners=bool(a["align_corners"]))


@converts("upsample_nearest2d.vec", "upsample_nearest2d.default", ir="resize")
def _nearest(em: AtenEmitter, a):
    x = a.get("input", a.get("self"))
    size = _check_scales(em, a, _scales(a, ("scales_h", "scales_w")))
    return em.op("resize", x, size=size, mode="nearest")
