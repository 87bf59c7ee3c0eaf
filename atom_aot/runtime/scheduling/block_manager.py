"""Paged KV-cache blocks with prefix caching, in plain Python (no torch).

A full block is identified by a chained hash, xxh64(parent hash + its token ids), so equal
prefixes map to equal hashes; a request's cache_salt is its first block's parent. Blocks are
reference-counted; a freed block that holds a full, hashed prefix stays findable until it is
reused, and reuse takes the least recently freed block first (a freed sequence's tail blocks are
queued ahead of its head, so shared heads live longest).
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import xxhash

from atom_aot.runtime.scheduling.sequence import Sequence

NO_HASH = -1


def chain_hash(token_ids: list[int], parent: int) -> int:
    h = xxhash.xxh64()
    if parent != NO_HASH:
        h.update(parent.to_bytes(8, "little"))
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    return h.intdigest()


def root_hash(cache_salt: str | None) -> int:
    """The parent of a request's first block: none, or its cache_salt's hash, so that only requests
    with the same salt share prefix blocks (vLLM's cache_salt)."""
    return NO_HASH if cache_salt is None else xxhash.xxh64(cache_salt.encode()).intdigest()


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash = NO_HASH
        self.token_ids: list[int] = []


class _Blocks(dict):
    """Block records made on first use: a GPU pool has tens of thousands of blocks, and making them
    all up front cost 0.3 s of start-up (measured with 58k blocks) before the first request."""

    def __missing__(self, block_id: int) -> Block:
        block = self[block_id] = Block(block_id)
        return block


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._num_blocks = num_blocks
        self.blocks = _Blocks()
        self.free_block_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.hash_to_block: dict[int, int] = {}
        self.prefix_queries = 0   # full prompt blocks looked up
        self.prefix_hits = 0      # of which found cached

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    # -- allocation -------------------------------------------------------------------------
    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """The cached blocks that hold this sequence's prefix (a lookup: nothing is taken).

        At least one token is always left to compute, so the step that follows produces logits.
        """
        if not self.enable_prefix_caching:
            return []
        found, parent = [], root_hash(seq.params.cache_salt)
        for index in range((seq.num_tokens - 1) // self.block_size):
            tokens = seq.block_tokens(index)
            parent = chain_hash(tokens, parent)
            block_id = self.hash_to_block.get(parent)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            found.append(block_id)
        return found

    def can_allocate_with_prefix(self, seq: Sequence, cached: list[int], num_new_tokens: int) -> bool:
        """Whether the cached prefix plus slots for `num_new_tokens` more tokens fit in the free pool."""
        revived = sum(1 for b in cached if self.blocks[b].ref_count == 0)   # free now, taken back
        covered = len(cached) * self.block_size + num_new_tokens
        return revived + max(0, -(-covered // self.block_size) - len(cached)) <= self.num_free_blocks

    def allocate_prefix(self, seq: Sequence, cached: list[int]) -> None:
        """Start a waiting sequence's block table with its cached prefix blocks."""
        assert not seq.block_table, "sequence already has blocks"
        if self.enable_prefix_caching:
            self.prefix_queries += (seq.num_tokens - 1) // self.block_size
            self.prefix_hits += len(cached)
        for block_id in cached:
            self._take(block_id)
            seq.block_table.append(block_id)
            seq.block_hashes.append(self.blocks[block_id].hash)
        seq.num_cached_tokens = len(cached) * self.block_size
        seq.num_computed_tokens = seq.num_cached_tokens

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        needed = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
        return max(0, needed - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq, num_new_tokens) <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Grow the block table so the next `num_new_tokens` tokens have slots."""
        for _ in range(self.blocks_needed(seq, num_new_tokens)):
            block_id = next(iter(self.free_block_ids))
            self._evict(block_id)
            self._take(block_id)
            seq.block_table.append(block_id)

    def free(self, seq: Sequence) -> None:
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids[block_id] = None
                if block.hash == NO_HASH:   # nothing worth keeping: reuse it first
                    self.free_block_ids.move_to_end(block_id, last=False)
        seq.block_table.clear()
        seq.block_hashes.clear()
        seq.num_computed_tokens = 0     # num_cached_tokens stays: the request's last output reports it

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the hashes of blocks that became full of computed tokens whose values are known
        (a block holding a pending token, sampled but not read yet, waits until it is read)."""
        if not self.enable_prefix_caching:
            return
        num_full = min(seq.num_computed_tokens, len(seq.token_ids)) // self.block_size
        for index in range(len(seq.block_hashes), num_full):
            parent = seq.block_hashes[-1] if seq.block_hashes else root_hash(seq.params.cache_salt)
            tokens = seq.block_tokens(index)
            h = chain_hash(tokens, parent)
            seq.block_hashes.append(h)
            block = self.blocks[seq.block_table[index]]
            if h not in self.hash_to_block:
                block.hash, block.token_ids = h, tokens
                self.hash_to_block[h] = block.block_id

    # -- internals --------------------------------------------------------------------------
    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free_block_ids[block_id]
        block.ref_count += 1

    def _evict(self, block_id: int) -> None:
        """Forget what a free block cached, before it is reused for other tokens."""
        block = self.blocks[block_id]
        if block.hash != NO_HASH and self.hash_to_block.get(block.hash) == block_id:
            del self.hash_to_block[block.hash]
        block.hash, block.token_ids = NO_HASH, []
