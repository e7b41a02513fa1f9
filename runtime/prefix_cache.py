"""Automatic prefix caching: the full KV blocks of finished prompts kept for the next request.

As vLLM does it: a full block is named by a digest chained over its tokens and its parent
block's digest, so one digest stands for the whole prefix up to the block's end, and two
sequences whose first k blocks hold the same tokens (and the same images) have the same k
digests. `BlockAllocator` (kv_cache.py) registers a block here once the step that filled it
has run (its keys and values are final from then on), shares it between the sequences whose
prefix matches (a reference count per block), and, when the last one lets go, keeps it here
as evictable: still cached, its data untouched, handed out again only when the free list is
empty, least recently used first. A partial block is never registered, so a block a sequence
is still writing is never shared, and a sequence never reuses its whole prompt (the last
prompt token is computed again, for its logits).

The digest is blake2b over the block's token ids as int64 bytes, its image feature rows (an
image token's id says nothing of which image it stands for; the rows the encoder made of it
do, byte for byte) and the parent's digest: stable across processes, unlike Python's hash().
Every operation costs O(the blocks it touches): dict and OrderedDict lookups, no scan.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

ROOT = bytes(32)  # the parent digest of a sequence's first block
_IMAGES = b"images"  # marks a block with image rows (token bytes alone are a fixed length)


def block_digest(parent: bytes, tokens: Sequence[int] | np.ndarray, image_rows: bytes = b""
                 ) -> bytes:
    """The digest of a block holding `tokens` (and the bytes of its image tokens' rows, if
    any) after the prefix whose last block's digest is `parent`."""
    h = hashlib.blake2b(parent, digest_size=32)
    h.update(np.asarray(tokens, np.int64).tobytes())
    if image_rows:
        h.update(_IMAGES)
        h.update(image_rows)
    return h.digest()


def extend_chain(chain: list[bytes], tokens: Sequence[int], images: Any, block_size: int,
                 upto: int) -> list[bytes]:
    """Extend `chain`, the digests of a sequence's first len(chain) full blocks, to `upto`
    blocks (tokens must hold them); in place, and returned. `images` is the sequence's
    vision.ImageRows (None without images). Tokens are only ever appended to a sequence, so
    a digest, once made, stays right: each block is hashed once."""
    parent = chain[-1] if chain else ROOT
    for index in range(len(chain), upto):
        start = index * block_size
        rows = b""
        if images is not None:
            mask, values = images.window(start, block_size)
            if mask.any():
                rows = mask.tobytes() + np.ascontiguousarray(values).tobytes()
        parent = block_digest(parent, tokens[start:start + block_size], rows)
        chain.append(parent)
    return chain


class PrefixCache:
    """Which block holds which digest, and the cached blocks nobody references (evictable),
    least recently released first. The reference counts live in the allocator."""

    def __init__(self) -> None:
        self.block_of: dict[bytes, int] = {}
        self.digest_of: dict[int, bytes] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self.block_of)

    def match(self, digests: Sequence[bytes]) -> list[int]:
        """The blocks of the longest cached prefix of `digests` (a chain), in order."""
        blocks = []
        for digest in digests:
            block = self.block_of.get(digest)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def register(self, block: int, digest: bytes) -> bool:
        """Name `block` (full, its data final) by `digest`; False (nothing changes) when
        another block already holds that prefix or `block` is already named."""
        if digest in self.block_of or block in self.digest_of:
            return False
        self.block_of[digest] = block
        self.digest_of[block] = digest
        return True

    def park(self, block: int) -> bool:
        """`block` lost its last reference: evictable if it is cached (True), else not."""
        if block not in self.digest_of:
            return False
        self.evictable[block] = None  # the most recently used end
        return True

    def claim(self, block: int) -> bool:
        """`block` gains its first reference again: no longer evictable; True if it was."""
        if block not in self.evictable:
            return False
        del self.evictable[block]
        return True

    def evict(self) -> int:
        """The least recently used evictable block, forgotten (its data is stale from now)."""
        block, _ = self.evictable.popitem(last=False)
        self.evictions += 1
        del self.block_of[self.digest_of.pop(block)]
        return block
