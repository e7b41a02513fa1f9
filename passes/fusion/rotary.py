"""Rotary position embedding: `x * cos + rotate_half(x) * sin` becomes `rotary_embedding`.

rotate_half as transformers writes it (Llama, Mistral, Qwen, GPT-NeoX):
`cat((-x[..., d/2:], x[..., :d/2]), dim=-1)`. The rotation must cover the whole last dim (partial
rotary, where only the first rotary_dim channels rotate, is left unfused) and cos/sin must
broadcast to x.
"""

from __future__ import annotations

from ..rewrite import RuleSet, rule
from ..rewrite.match import same_dim as equal
from .common import last_axis, misfit

_OPEN_END = 2**62  # torch.export writes sys.maxsize for an open end (`x[..., d:]`)


def _rotary(op, x, cos, sin):
    first = op.slice(x, _name="first")
    second = op.slice(x, _name="second")
    rotated = op.concat(op.neg(second), first, _name="rotated")
    return op.add(op.mul(x, cos), op.mul(rotated, sin))


def _ends_at(end, size) -> bool:
    return (isinstance(end, int) and end >= _OPEN_END) or equal(end, size)


def _check(ctx, x, cos, sin, first, second, rotated, **_):
    rank = x.type.rank
    if rank == 0:
        return "x is a scalar"
    size = x.shape[-1]
    a, b = first.producer.attrs, second.producer.attrs
    if not (last_axis(a["dim"], rank) and last_axis(b["dim"], rank)
            and last_axis(rotated.producer.attrs["dim"], rank)):
        return "rotate_half must slice and concatenate the last dim"
    if a["step"] != 1 or b["step"] != 1 or a["start"] != 0:
        return "the first half must be x[..., :d/2]"
    half = a["end"]
    if not (equal(half * 2, size) and equal(b["start"], half) and _ends_at(b["end"], size)):
        return f"the halves [0:{half}] and [{b['start']}:{b['end']}] do not split {size} in two"
    return misfit("rotary_embedding", [x, cos, sin])


ROTARY = rule("rotary_embedding", _rotary, lambda op, x, cos, sin, **_: op.rotary_embedding(
    x, cos, sin), check=_check)

RULES = RuleSet([ROTARY], "rotary")
