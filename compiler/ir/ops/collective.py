"""Communication ops, and `shard`, the sharding annotation.

A partitioned model is still one IR: values carry a layout over a device mesh (replicated, split on
a dim over a mesh axis, or a partial sum over an axis), written as `shard(%x) {layout="tp:S1"}`,
and the layout changes that need communication are explicit collective ops. Each collective comes
in two forms. Before partitioning it names only its mesh `axis`, leaves `ranks` as none and keeps
the global shape, so the annotated graph still runs unchanged on one device (every op here is then
the identity). After partitioning, `ranks` lists the ranks that take part and types are the local
shards' (`all_gather` multiplies `dim` by the group size, `reduce_scatter` divides it).

`send`/`recv` move a value between pipeline stages (`peer` is a rank, `tag` pairs them up).
`send` returns its operand so that it has a result (the text form needs one) and orders later
uses after the transfer.

The reference semantics call the `Communicator` bound with `bind_communicator` (the runtime binds
one over torch.distributed; tests can bind an in-process one), so this module never imports
torch.distributed itself and `import compiler.ir` stays free of torch.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from ..dtypes import DType
from ..symbolic import normalize
from ..types import TensorType
from . import shape_rules as rules
from .registry import REQUIRED, ShapeError, define

# The ops that move data between ranks; runtimes execute these themselves, not through a backend.
# (expert_dispatch and expert_combine are defined in expert_comm.py)
COMMUNICATION_OPS = frozenset({"all_reduce", "all_gather", "reduce_scatter", "send", "recv",
                               "expert_dispatch", "expert_combine"})


class Communicator(Protocol):
    """What collective ops need from a distributed runtime; `group` is a tuple of global ranks."""

    rank: int

    def all_reduce(self, x: Any, group: tuple[int, ...]) -> Any: ...
    def all_gather(self, x: Any, dim: int, group: tuple[int, ...]) -> Any: ...
    def reduce_scatter(self, x: Any, dim: int, group: tuple[int, ...]) -> Any: ...
    def send(self, x: Any, peer: int, tag: int) -> None: ...
    def recv(self, shape: Sequence[int], dtype: DType, peer: int, tag: int) -> Any: ...
    def all_to_all(self, x: Any, send_counts: Sequence[int], recv_counts: Sequence[int],
                   group: tuple[int, ...]) -> Any:
        """Rows of x (dim 0) in consecutive chunks of send_counts[i] to group[i]; returns the
        chunks received, recv_counts[i] rows from group[i], concatenated in group order."""


_CURRENT: contextvars.ContextVar[Communicator | None] = contextvars.ContextVar(
    "dayzero_communicator", default=None)


@contextlib.contextmanager
def bind_communicator(comm: Communicator) -> Iterator[Communicator]:
    """Run collective ops inside this block through `comm` (per thread / task, not global)."""
    token = _CURRENT.set(comm)
    try:
        yield comm
    finally:
        _CURRENT.reset(token)


def current_communicator() -> Communicator | None:
    return _CURRENT.get()


def _comm(op: str) -> Communicator:
    comm = _CURRENT.get()
    if comm is None:
        raise RuntimeError(f"{op} over more than one rank needs a distributed runtime; run the "
                           "artifact with `dayzero run --nproc N` or under torchrun")
    return comm


def _trivial(ranks) -> bool:
    """Global form (no ranks yet) or a group of one rank: the collective is the identity."""
    return ranks is None or len(ranks) <= 1


def _all_reduce(x, axis, ranks):
    return x if _trivial(ranks) else _comm("all_reduce").all_reduce(x, tuple(ranks))


def _all_gather(x, axis, dim, ranks):
    return x if _trivial(ranks) else _comm("all_gather").all_gather(x, dim, tuple(ranks))


def _reduce_scatter(x, axis, dim, ranks):
    return x if _trivial(ranks) else _comm("reduce_scatter").reduce_scatter(x, dim, tuple(ranks))


def _send(x, peer, tag):
    _comm("send").send(x, peer, tag)
    return x


def _recv(shape, dtype, peer, tag):
    return _comm("recv").recv(list(shape), dtype, peer, tag)


def _scaled_dim(types, attrs, grow: bool):
    x = types[0]
    dim = rules.norm_axis(attrs["dim"], x.rank)
    ranks = attrs["ranks"]
    if _trivial(ranks):
        return [x]
    n = len(ranks)
    size = x.shape[dim]
    if grow:
        new = normalize(size * n)
    else:
        if isinstance(size, int) and size % n:
            raise ShapeError(f"reduce_scatter: dim {dim} of size {size} does not split into {n}")
        new = normalize(size / n) if not isinstance(size, int) else size // n
    return [x.with_shape(x.shape[:dim] + (new,) + x.shape[dim + 1:])]


def _ranks_check(rule):
    def check(types, attrs):
        ranks = attrs.get("ranks")
        if ranks is not None and (not isinstance(ranks, list) or
                                  not all(isinstance(r, int) for r in ranks)):
            raise ShapeError(f"ranks must be a list of ranks or none, got {ranks!r}")
        return rule(types, attrs)
    return check


def _recv_rule(types, attrs):
    return [TensorType(attrs["dtype"], tuple(attrs["shape"]))]


def _layout_rule(types, attrs):
    if not isinstance(attrs["layout"], str):
        raise ShapeError(f"shard layout must be a string like \"tp:S0\", got {attrs['layout']!r}")
    return [types[0]]


define("shard", "x", _layout_rule, lambda x, layout: x, "other",
       "x with the given layout (sharding annotation; identity on one device)",
       layout=REQUIRED)
define("all_reduce", "x", _ranks_check(rules.unary), _all_reduce, "collective",
       "sum of x over the ranks of a mesh axis", axis=REQUIRED, ranks=None)
define("all_gather", "x", _ranks_check(lambda t, a: _scaled_dim(t, a, True)), _all_gather,
       "collective", "the ranks' shards of x concatenated along dim", axis=REQUIRED,
       dim=REQUIRED, ranks=None)
define("reduce_scatter", "x", _ranks_check(lambda t, a: _scaled_dim(t, a, False)),
       _reduce_scatter, "collective", "sum over the ranks of a mesh axis, each keeping its "
       "shard along dim", axis=REQUIRED, dim=REQUIRED, ranks=None)
define("send", "x", rules.unary, _send, "collective",
       "send x to rank peer (pipeline transfer); returns x", peer=REQUIRED, tag=REQUIRED)
define("recv", "", _recv_rule, _recv, "collective",
       "receive a tensor of the given type from rank peer (pipeline transfer)",
       shape=REQUIRED, dtype=REQUIRED, peer=REQUIRED, tag=REQUIRED)
