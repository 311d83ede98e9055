"""The pool of KV cache blocks: ref counts, a free queue in eviction order, the prefix-cache map.

A block whose ref count drops to 0 is *free* but keeps its hash and contents until it is reused:
a later request with the same prefix can revive it with :meth:`BlockPool.touch`. The free queue
is ordered by eviction priority (front = evicted first): unhashed blocks go to the front (their
contents are worthless), hashed blocks to the back (least recently freed is evicted first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from host.core.kv_cache.hashing import BlockHash


class KVCacheBlock:
    """One block of the paged KV cache: the same block id in every layer of the KV cache group
    that allocated it (with a single group, every layer).

    ``block_hash`` is its prefix-cache key while cached: the chained block hash for group 0,
    ``(hash, group_id)`` for the other groups of a hybrid layout (each group caches its own
    blocks of the same tokens)."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free", "next_free", "is_null")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockHash | tuple[BlockHash, int] | None = None
        # links of the doubly linked free queue (None while the block is in use)
        self.prev_free: KVCacheBlock | None = None
        self.next_free: KVCacheBlock | None = None
        self.is_null = False

    def __repr__(self) -> str:
        key = self.block_hash[0] if isinstance(self.block_hash, tuple) else self.block_hash
        h = key.hex()[:8] if key else None
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, hash={h})"


class FreeBlockQueue:
    """Doubly linked list of free blocks in eviction order, with O(1) pop, append and removal
    from the middle (a prefix hit takes a block out of the queue wherever it sits)."""

    def __init__(self, blocks: Iterable[KVCacheBlock] = ()) -> None:
        # sentinels keep the link updates branch-free
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self.num_free_blocks

    def popleft(self) -> KVCacheBlock:
        """Take the block to evict next (the front)."""
        block = self._head.next_free
        if block is self._tail or block is None:
            raise ValueError("no free blocks left in the KV cache free queue")
        self._unlink(block)
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if n > self.num_free_blocks:
            raise ValueError(f"asked for {n} free blocks, only {self.num_free_blocks} are free")
        return [self.popleft() for _ in range(n)]

    def remove(self, block: KVCacheBlock) -> None:
        """Take ``block`` out of the queue wherever it is."""
        if block.prev_free is None or block.next_free is None:
            raise ValueError(f"{block!r} is not in the free queue")
        self._unlink(block)

    def append(self, block: KVCacheBlock) -> None:
        """Add ``block`` at the back (evicted last)."""
        last = self._tail.prev_free
        assert last is not None
        block.prev_free = last
        block.next_free = self._tail
        last.next_free = block
        self._tail.prev_free = block
        self.num_free_blocks += 1

    def appendleft(self, block: KVCacheBlock) -> None:
        """Add ``block`` at the front (evicted / reused first)."""
        first = self._head.next_free
        assert first is not None
        block.prev_free = self._head
        block.next_free = first
        first.prev_free = block
        self._head.next_free = block
        self.num_free_blocks += 1

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """The queue front to back (tests and debugging)."""
        out = []
        cur = self._head.next_free
        while cur is not None and cur is not self._tail:
            out.append(cur)
            cur = cur.next_free
        return out

    def _unlink(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free, block.next_free
        assert prev is not None and nxt is not None
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookups counted in tokens: ``queries`` tokens looked up, ``hits`` found."""

    requests: int = 0
    queries: int = 0
    hits: int = 0

    def record(self, num_tokens: int, num_hits: int) -> None:
        self.requests += 1
        self.queries += num_tokens
        self.hits += num_hits

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    def reset(self) -> None:
        self.requests = self.queries = self.hits = 0


class BlockPool:
    """Owns every :class:`KVCacheBlock`: hands out free ones, takes them back, and remembers
    which full blocks hold which prefix (hash -> block) for prefix caching.

    Block 0 is the null block: taken out at start-up, never allocated and never ref counted.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks={num_blocks} must be >= 2 (block 0 is the null block)")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue = FreeBlockQueue(self.blocks)
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        # hash -> one block, promoted to {block_id: block} when several blocks share the hash
        self._cached: dict[Any, KVCacheBlock | dict[int, KVCacheBlock]] = {}
        self.prefix_cache_stats = PrefixCacheStats()

    # -- allocation ---------------------------------------------------------------------------
    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take ``num_blocks`` blocks from the front of the free queue (ref count 1 each); a
        reused block that still held a cached prefix is evicted from the hash map first."""
        if num_blocks > self.free_block_queue.num_free_blocks:
            raise ValueError(
                f"cannot allocate {num_blocks} blocks: only {self.get_num_free_blocks()} are free"
            )
        blocks = self.free_block_queue.popleft_n(num_blocks)
        for block in blocks:
            if block.block_hash is not None:
                self._evict(block)
            block.ref_cnt += 1
        return blocks

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on prefix-hit blocks; a free one leaves the free queue (and so can
        no longer be evicted)."""
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block, in the given order (pass a request's blocks in
        reverse so its tail, which covers the longest and least shareable prefix, is evicted
        first). A block reaching 0 goes to the back of the queue when hashed, to the front when
        not."""
        for block in ordered_blocks:
            if block.is_null:
                continue
            if block.ref_cnt <= 0:
                raise ValueError(f"double free of {block!r}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None:
                    self.free_block_queue.appendleft(block)
                else:
                    self.free_block_queue.append(block)

    # -- prefix cache -------------------------------------------------------------------------
    def cache_full_blocks(
        self,
        blocks: Sequence[KVCacheBlock],
        block_hashes: Sequence[BlockHash],
        num_cached_blocks: int,
        num_full_blocks: int,
        group_id: int = 0,
    ) -> None:
        """Record ``hash -> block`` for ``blocks[num_cached_blocks:num_full_blocks]`` (blocks that
        just became full); ``block_hashes[i]`` is the chained hash of block ``i``. Blocks that
        already carry a hash (prefix hits) and the null block are skipped. ``group_id``: the KV
        cache group the blocks belong to (a hybrid layout caches each group's blocks under its
        own key)."""
        if not self.enable_caching or num_full_blocks <= num_cached_blocks:
            return
        if num_full_blocks > len(block_hashes):
            raise ValueError(
                f"cannot cache {num_full_blocks} full blocks with {len(block_hashes)} block hashes"
            )
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block.is_null or block.block_hash is not None:
                continue
            block_hash = block_hashes[i] if group_id == 0 else (block_hashes[i], group_id)
            block.block_hash = block_hash
            entry = self._cached.get(block_hash)
            if entry is None:
                self._cached[block_hash] = block
            elif isinstance(entry, dict):
                entry[block.block_id] = block
            else:
                self._cached[block_hash] = {entry.block_id: entry, block.block_id: block}

    def get_cached_block(self, block_hash: BlockHash, group_id: int = 0) -> KVCacheBlock | None:
        """A block of KV cache group ``group_id`` holding the prefix ``block_hash`` names, or None."""
        entry = self._cached.get(block_hash if group_id == 0 else (block_hash, group_id))
        if entry is None or isinstance(entry, KVCacheBlock):
            return entry
        return next(iter(entry.values()))

    def num_cached_blocks(self) -> int:
        return sum(1 if isinstance(e, KVCacheBlock) else len(e) for e in self._cached.values())

    def _evict(self, block: KVCacheBlock) -> None:
        block_hash = block.block_hash
        assert block_hash is not None
        block.block_hash = None
        entry = self._cached.get(block_hash)
        if entry is None:
            return
        if isinstance(entry, dict):
            entry.pop(block.block_id, None)
            if len(entry) == 1:
                self._cached[block_hash] = next(iter(entry.values()))
            elif not entry:
                del self._cached[block_hash]
        elif entry is block:
            del self._cached[block_hash]

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix. Only possible while no block is in use; returns whether
        it happened."""
        if self.get_num_free_blocks() != self.num_blocks - 1:
            return False
        self._cached.clear()
        for block in self.blocks:
            block.block_hash = None
        self.prefix_cache_stats.reset()
        return True

    # -- stats ---------------------------------------------------------------------------------
    def get_usage(self) -> float:
        """Fraction of allocatable blocks in use (0.0 - 1.0)."""
        total = self.num_blocks - 1
        return 1.0 - self.get_num_free_blocks() / total


class BlockPoolView:
    """What a KV cache manager reports of its :class:`BlockPool` (``self.block_pool``), shared by
    the single-group and the hybrid manager: usage over every block, free blocks, prefix-cache
    stats, and the prefix-cache reset."""

    block_pool: BlockPool

    @property
    def usage(self) -> float:
        """Fraction of usable blocks in use (every group's)."""
        return self.block_pool.get_usage()

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.get_num_free_blocks()

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        return self.block_pool.prefix_cache_stats

    def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix; only works while no request holds blocks."""
        return self.block_pool.reset_prefix_cache()
