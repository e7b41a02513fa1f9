"""Expert-parallel communication: the all-to-all dispatch and combine of a partitioned `moe`.

Under `parallel: {expert_parallel: N}` each rank of an expert group holds E/N of a `moe` op's
experts (rank p owns experts [p*E/N, (p+1)*E/N)). The tokens reaching the op are replicated
over the group, so each rank takes its own contiguous slice of them, [p*T//N, (p+1)*T//N), and:

- `expert_dispatch(x, indices)` sends each of its (token, choice) pairs, sorted by expert, to
  the rank owning the chosen expert. The counts go first (one small all-to-all: how many rows
  for each of the receiver's experts), then the rows themselves (an all-to-all of variable
  sizes). It returns the rows this rank received, grouped by source rank and, within a source,
  sorted by expert; the local expert id of every row; and how many rows came from each source.
  The number of rows depends on the routing, so it is a size symbol of its own, named by the
  `rows` attribute and bound when the rows arrive.
- `expert_combine(y, sources, weights, indices)` sends the expert outputs back to their sources
  (the inverse all-to-all), puts them in pair order, sums each token's k outputs weighted by its
  routing weights (in choice order, as eager does) and all-gathers the slices into the whole
  [tokens, hidden] result, replicated again.

Neither op exists on one device: both need a group of at least two ranks (`ranks`), and the
partitioner (passes/parallel/expert_parallel.py) is the only one that makes them. Like the other
collectives, their semantics call the bound `Communicator`; its `all_to_all` moves rows with
per-rank counts (torch.distributed's all_to_all_single, which gloo implements).
"""

from __future__ import annotations

from ..dtypes import DType
from ..symbolic import equal, symbol
from ..types import TensorType
from .collective import _comm
from .registry import REQUIRED, ShapeError, define


def token_slice(tokens: int, size: int, position: int) -> tuple[int, int]:
    """The tokens [lo, hi) rank `position` of a group of `size` dispatches: balanced, contiguous
    slices that differ by at most one token (empty ones when there are fewer tokens than ranks)."""
    return position * tokens // size, (position + 1) * tokens // size


def _group(op: str, ranks) -> tuple[int, ...]:
    if not isinstance(ranks, list) or len(ranks) < 2 or \
            not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
        raise ShapeError(f"{op}: ranks must list the two or more ranks of an expert group, got "
                         f"{ranks!r} (the op exists only in a partitioned rank's program)")
    return tuple(ranks)


def _experts_per_rank(op: str, experts, ranks) -> int:
    n = len(_group(op, ranks))
    if not isinstance(experts, int) or isinstance(experts, bool) or experts < 1 \
            or experts % n:
        raise ShapeError(f"{op}: experts={experts!r} must be a positive multiple of the "
                         f"{n} ranks of its group")
    return experts // n


def _routing_types(op: str, tokens_type: TensorType, indices: TensorType) -> None:
    if tokens_type.rank != 2 or indices.rank != 2 or indices.dtype != DType.i64:
        raise ShapeError(f"{op} takes tokens [tokens, hidden] and i64 expert indices "
                         f"[tokens, k]; got {tokens_type}, {indices}")


def _dispatch_rule(types, attrs):
    x, indices = types
    _experts_per_rank("expert_dispatch", attrs["experts"], attrs["ranks"])
    _routing_types("expert_dispatch", x, indices)
    if not equal(x.shape[0], indices.shape[0]):
        raise ShapeError(f"expert_dispatch: x {x} and indices {indices} disagree on the tokens")
    name = attrs["rows"]
    if not isinstance(name, str) or not name.isidentifier():
        raise ShapeError(f"expert_dispatch: rows must name the size symbol of the rows received, "
                         f"got {name!r}")
    rows = symbol(name)
    n = len(attrs["ranks"])
    return [x.with_shape((rows, x.shape[1])), TensorType(DType.i64, (rows,)),
            TensorType(DType.i64, (n,))]


def _combine_rule(types, attrs):
    y, sources, weights, indices = types
    n = len(_group("expert_combine", attrs["ranks"]))
    _experts_per_rank("expert_combine", attrs["experts"], attrs["ranks"])
    _routing_types("expert_combine", weights, indices)
    if y.rank != 2 or sources.dtype != DType.i64 or sources.shape != (n,) \
            or weights.dtype != y.dtype or weights.shape != indices.shape:
        raise ShapeError(f"expert_combine takes rows y [rows, hidden], i64 sources [{n}], "
                         f"weights [tokens, k] of y's dtype and i64 indices [tokens, k]; got "
                         f"{y}, {sources}, {weights}, {indices}")
    return [y.with_shape((indices.shape[0], y.shape[1]))]


def _pairs(comm, indices, experts: int, group: tuple[int, ...]):
    """This rank's slice, its (token, choice) pairs in expert order, and the pair counts per
    destination rank and expert ([ranks, experts per rank])."""
    import torch

    n = len(group)
    lo, hi = token_slice(indices.shape[0], n, group.index(comm.rank))
    flat = indices[lo:hi].reshape(-1)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= experts):
        raise ValueError(f"expert index outside [0, {experts}) in the routing")
    order = torch.sort(flat, stable=True).indices
    counts = torch.bincount(flat, minlength=experts).reshape(n, experts // n)
    return lo, hi, order, counts


def _dispatch(x, indices, axis, experts, rows, ranks):
    import torch

    comm = _comm("expert_dispatch")
    group = _group("expert_dispatch", ranks)
    n, local = len(group), experts // len(group)
    lo, _, order, counts = _pairs(comm, indices, experts, group)
    received = comm.all_to_all(counts.reshape(-1), [local] * n, [local] * n, group).reshape(
        n, local)
    payload = x[lo + torch.div(order, indices.shape[1], rounding_mode="floor")]
    moved = comm.all_to_all(payload, counts.sum(1).tolist(), received.sum(1).tolist(), group)
    ids = torch.repeat_interleave(torch.arange(local).repeat(n), received.reshape(-1))
    return moved, ids, received.sum(1)


def _combine(y, sources, weights, indices, axis, experts, ranks):
    import torch

    comm = _comm("expert_combine")
    group = _group("expert_combine", ranks)
    n, (tokens, k), hidden = len(group), indices.shape, y.shape[1]
    lo, hi, order, counts = _pairs(comm, indices, experts, group)
    back = comm.all_to_all(y, sources.tolist(), counts.sum(1).tolist(), group)
    pairs = torch.empty_like(back)
    pairs[order] = back
    mine = (pairs.reshape(hi - lo, k, hidden) * weights[lo:hi].unsqueeze(-1)).sum(1)
    chunk = -(-tokens // n)  # slices differ by at most one token: pad each to the longest
    padded = torch.zeros((chunk, hidden), dtype=mine.dtype)
    padded[:hi - lo] = mine
    gathered = comm.all_gather(padded, 0, group)
    parts = [gathered[q * chunk:q * chunk + (b - a)]
             for q, (a, b) in enumerate(token_slice(tokens, n, q) for q in range(n))]
    return torch.cat(parts, 0)


define("expert_dispatch", "x indices", _dispatch_rule, _dispatch, "collective",
       "send this rank's slice of token-expert pairs to the ranks owning the experts "
       "(all-to-all); returns the rows received, their local expert ids, the rows per source",
       axis=REQUIRED, experts=REQUIRED, rows=REQUIRED, ranks=REQUIRED)
define("expert_combine", "y sources weights indices", _combine_rule, _combine, "collective",
       "return expert outputs to their tokens (inverse all-to-all), sum each token's k outputs "
       "by its routing weights and all-gather the token slices", axis=REQUIRED,
       experts=REQUIRED, ranks=REQUIRED)
