"""Long sweeps run whole on request and as a fixed sample in CI.

A sweep (every op of PyTorch's OpInfo database, say) is worth running when its subject changes,
not on every commit: CI has a time budget on two shared cores. `python -m pytest --sweep` runs
every sweep whole; without it each sweep keeps its `always` items plus a fixed, spread-out share
of the rest, chosen by a hash of the item's name, so the sample neither drifts between runs nor
clusters in one family of ops.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Collection, Iterable
from typing import TypeVar

import pytest

T = TypeVar("T")

SAMPLE_SHARE = 0.25


def in_sample(name: str, share: float = SAMPLE_SHARE) -> bool:
    """Whether `name` falls in the fixed sample of `share` of all names."""
    return zlib.crc32(name.encode()) % 1000 < share * 1000


def sweep(config: pytest.Config, items: Iterable[T], name_of: Callable[[T], str],
          always: Collection[str] = ()) -> list[T]:
    """All of `items` under `--sweep`; else those named in `always` and the fixed sample."""
    items = list(items)
    if config.getoption("sweep"):
        return items
    return [x for x in items if name_of(x) in always or in_sample(name_of(x))]
