"""A full-attention KV cache group: every token's KV stays until the request ends."""

from __future__ import annotations

from typing import Sequence

from host.contracts.request import BlockHash
from host.core.kv_cache.block_pool import KVCacheBlock
from host.core.kv_cache.group_manager import GroupManager


class FullAttentionGroup(GroupManager):
    """Causal attention over the whole sequence: a prefix hit is the run of cached blocks from
    the first block on; no block is freed before the request ends."""

    def find_longest_cache_hit(self, block_hashes: Sequence[BlockHash], max_blocks: int) -> list[KVCacheBlock]:
        hit: list[KVCacheBlock] = []
        get = self.block_pool.get_cached_block
        gid = self.group_id
        for block_hash in block_hashes[:max_blocks]:
            block = get(block_hash, gid)
            if block is None:
                break
            hit.append(block)
        return hit
