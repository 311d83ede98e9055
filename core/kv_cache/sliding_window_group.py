"""A sliding-window KV cache group: only the blocks the window can still read are kept.

A token at position ``p`` attends to positions ``p - window + 1 .. p``. When a step starts with
``num_computed_tokens = c`` tokens in the cache, its first new token sits at ``c``, so no token
of this step or later reads a position before ``c - window + 1``: the blocks entirely before it
are freed (and stay in the prefix cache while nobody reuses them), their table entries become the
null block. With chunked prefill this holds chunk by chunk: the tokens computed in a step are in
blocks allocated for that step, and the window of its first token is kept.
"""

from __future__ import annotations

from typing import Sequence

from host.contracts.request import BlockHash
from host.core.kv_cache.block_pool import BlockPool, KVCacheBlock
from host.core.kv_cache.group_manager import GroupManager
from host.core.kv_cache.spec import SlidingWindowSpec


class SlidingWindowGroup(GroupManager):
    """Layers attending over the last ``spec.sliding_window`` tokens."""

    def __init__(self, spec: SlidingWindowSpec, group_id: int, block_pool: BlockPool, enable_caching: bool) -> None:
        super().__init__(spec, group_id, block_pool, enable_caching)
        self.window = spec.sliding_window
        # per request: its leading table entries already replaced by the null block
        self._num_skipped: dict[str, int] = {}

    def first_needed_block(self, num_computed_tokens: int) -> int:
        """The first block a step starting at ``num_computed_tokens`` (or any later one) reads."""
        return max(0, num_computed_tokens - self.window + 1) // self.block_size

    def find_longest_cache_hit(self, block_hashes: Sequence[BlockHash], max_blocks: int) -> list[KVCacheBlock]:
        """The largest ``E <= max_blocks`` whose window is cached: the blocks from
        :meth:`first_needed_block` ``(E * block_size)`` to ``E - 1``; the entries before are null.
        Scanned from the right, each block is looked up at most once."""
        get = self.block_pool.get_cached_block
        gid = self.group_id
        found: dict[int, KVCacheBlock] = {}
        end = max_blocks
        while end > 0:
            start = self.first_needed_block(end * self.block_size)
            j = end - 1
            while j >= start:
                block = found.get(j)
                if block is None:
                    block = get(block_hashes[j], gid)
                    if block is None:
                        break
                    found[j] = block
                j -= 1
            if j < start:
                return [self.null_block] * start + [found[i] for i in range(start, end)]
            end = j  # block j is missing: a hit ends before it
        return []

    def remove_skipped_blocks(self, req_id: str, num_computed_tokens: int) -> None:
        blocks = self.req_to_blocks.get(req_id)
        if not blocks:
            return
        stop = min(self.first_needed_block(num_computed_tokens), len(blocks))
        done = self._num_skipped.get(req_id, 0)
        if stop <= done:
            return
        null = self.null_block
        freed = []
        for i in range(stop - 1, done - 1, -1):  # newest first: the oldest are evicted first
            block = blocks[i]
            if block is not null:
                freed.append(block)
                blocks[i] = null
        self._num_skipped[req_id] = stop
        if freed:
            self.block_pool.free_blocks(reversed(freed))

    def attach_hit(self, req_id: str, hit: Sequence[KVCacheBlock]) -> None:
        super().attach_hit(req_id, hit)
        null = self.null_block
        skipped = 0
        while skipped < len(hit) and hit[skipped] is null:
            skipped += 1
        self._num_skipped[req_id] = skipped

    def detach(self, req_id: str) -> list[KVCacheBlock]:
        self._num_skipped.pop(req_id, None)
        return super().detach(req_id)
