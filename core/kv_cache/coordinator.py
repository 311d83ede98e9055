"""The hybrid KV cache manager: per-group block tables over one shared block pool.

A model whose layers are of several kinds (full attention, sliding windows) is laid out as
equal-size KV cache groups (:mod:`host.core.kv_cache.groups`). This coordinator owns one
:class:`~host.core.kv_cache.group_manager.GroupManager` per group and offers the scheduler the
same calls as the single-group :class:`~host.core.kv_cache.manager.KVCacheManager`:

- a **prefix hit** counts up to where every group holds the blocks: the largest ``L`` (whole
  blocks) such that every full-attention group has blocks ``0..L-1`` cached and every
  sliding-window group has the blocks of the window ending at ``L``. Each group's longest hit
  is searched, the shortest wins, and the search repeats at that length until all agree
  (a shorter end can move a sliding group's window onto blocks that are not cached);
- **allocation** is all or nothing across groups: every group's table grows to the same
  length, and the blocks all groups need together are checked against the free blocks once;
- at each allocation a sliding-window group first frees the blocks its window has left.

The hit object and the new blocks are :class:`GroupedBlocks` (one list per group); the worker
gets group 0's block ids where a single group's would go and the other groups' beside them
(:class:`~host.contracts.scheduler_output.NewRequestData`).
"""

from __future__ import annotations

from typing import Sequence

from host.contracts.request import Request
from host.core.kv_cache.block_pool import BlockPool, BlockPoolView, KVCacheBlock
from host.core.kv_cache.full_attention_group import FullAttentionGroup
from host.core.kv_cache.group_manager import GroupManager, get_group_manager_class, register_group_manager
from host.core.kv_cache.groups import KVCacheLayout, group_blocks_per_request
from host.core.kv_cache.sliding_window_group import SlidingWindowGroup
from host.core.kv_cache.spec import FullAttentionSpec, KVCacheConfig, SlidingWindowSpec


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class GroupedBlocks:
    """Blocks of every KV cache group: ``groups[g]`` is group ``g``'s list (a prefix hit's
    table, or the blocks one allocation added). False when it covers no token."""

    __slots__ = ("groups", "num_tokens")

    def __init__(self, groups: list[list[KVCacheBlock]], num_tokens: int) -> None:
        self.groups = groups
        self.num_tokens = num_tokens

    def __bool__(self) -> bool:
        return any(self.groups)

    def __len__(self) -> int:
        """Blocks in all groups (the null block included)."""
        return sum(len(g) for g in self.groups)

    def block_ids(self) -> list[list[int]]:
        return [[b.block_id for b in g] for g in self.groups]


class HybridKVCacheManager(BlockPoolView):
    """Per-request block tables of every KV cache group over one :class:`BlockPool`.

    Built from a :class:`KVCacheConfig` whose ``layout`` has more than one group (or one
    sliding-window group: every layer with the same window); ``num_blocks`` counts the reserved
    null block. ``grouped`` tells the scheduler that new blocks come as :class:`GroupedBlocks`."""

    grouped = True

    def __init__(self, kv_cache_config: KVCacheConfig, *, enable_caching: bool = True, max_model_len: int | None = None) -> None:
        layout = kv_cache_config.layout
        if layout is None or not (layout.is_hybrid or layout.frees_windows):
            raise ValueError(
                "HybridKVCacheManager needs a KVCacheConfig whose layout has several groups or a sliding-window group"
            )
        self.kv_cache_config = kv_cache_config
        self.layout: KVCacheLayout = layout
        self.block_size = kv_cache_config.block_size
        self.num_blocks = kv_cache_config.num_blocks
        self.enable_caching = enable_caching
        self.max_model_len = max_model_len
        self.block_pool = BlockPool(self.num_blocks, enable_caching)
        self.groups: list[GroupManager] = [
            get_group_manager_class(type(g.spec))(g.spec, gid, self.block_pool, enable_caching)
            for gid, g in enumerate(layout.groups)
        ]
        self.num_groups = len(self.groups)
        self._first = self.groups[0]
        self._sliding = [g for g in self.groups if isinstance(g, SlidingWindowGroup)]
        self._no_new = GroupedBlocks([[] for _ in self.groups], 0)

    # -- prefix cache -------------------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> tuple[GroupedBlocks | list, int]:
        """The longest prefix hit every group can serve (see the module docstring) and the
        tokens it covers; ``([], 0)`` for none. As with one group, at most ``num_tokens - 1``
        tokens hit, and a request asking for prompt logprobs gets none."""
        if not self.enable_caching:
            return [], 0
        if getattr(request.sampling_params, "prompt_logprobs", None) is not None:
            return [], 0
        hashes = request.block_hashes
        length = min((request.num_tokens - 1) // self.block_size, len(hashes))
        hits: list[list[KVCacheBlock]] = [[] for _ in self.groups]
        while length > 0:
            agreed = True
            for gid, group in enumerate(self.groups):
                hit = group.find_longest_cache_hit(hashes, length)
                hits[gid] = hit
                if len(hit) < length:
                    length = len(hit)
                    agreed = False
            if agreed:
                break
        if length <= 0:
            return [], 0
        return GroupedBlocks([h[:length] for h in hits], length * self.block_size), length * self.block_size

    # -- allocation ---------------------------------------------------------------------------
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: GroupedBlocks | Sequence[KVCacheBlock] | None = None,
        num_new_computed_tokens: int = 0,
        delay_cache: bool = False,
    ) -> GroupedBlocks | None:
        """Make room in every group for ``num_new_tokens`` more tokens of ``request`` (after its
        computed tokens and the ``num_new_computed_tokens`` of the prefix hit
        ``new_computed_blocks``). Returns the new blocks per group, or None (nothing changed
        but blocks the windows had left, which are freed either way) when the pool has too few."""
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens={num_new_tokens} must be > 0")
        req_id = request.request_id
        hit = new_computed_blocks if isinstance(new_computed_blocks, GroupedBlocks) and new_computed_blocks else None
        if new_computed_blocks and hit is None:
            raise ValueError("a hybrid KV cache takes the prefix hit get_computed_blocks returned (GroupedBlocks)")
        hit_tokens = hit.num_tokens if hit is not None else 0
        if num_new_computed_tokens != hit_tokens:
            raise ValueError(
                f"num_new_computed_tokens={num_new_computed_tokens} does not match the prefix hit's {hit_tokens} tokens"
            )
        num_owned = self._first.num_owned(req_id)
        if hit is not None and num_owned:
            raise ValueError(f"request {req_id!r} already owns blocks; prefix hits attach only at admission")
        if num_owned:
            for group in self._sliding:
                group.remove_skipped_blocks(req_id, request.num_computed_tokens)
            # the common case, a running request whose tables already hold the tokens (and whose
            # full blocks are cached: every group caches in step with group 0)
            total_tokens = request.num_computed_tokens + num_new_tokens
            if total_tokens <= num_owned * self.block_size and (
                not self.enable_caching or delay_cache
                or min(total_tokens // self.block_size, len(request.block_hashes))
                <= self._first.num_cached_blocks.get(req_id, 0)
            ):
                return self._no_new

        total_tokens = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        num_hit_blocks = hit_tokens // self.block_size
        per_group = _cdiv(total_tokens, self.block_size) - num_owned - num_hit_blocks
        if per_group > 0 or hit is not None:
            # prefix-hit blocks sitting in the free queue stop being allocatable once touched
            evictable = sum(1 for g in hit.groups for b in g if b.ref_cnt == 0 and not b.is_null) if hit else 0
            if max(per_group, 0) * self.num_groups > self.block_pool.get_num_free_blocks() - evictable:
                return None

        if not num_owned and req_id not in self._first.req_to_blocks:
            if self.enable_caching:  # admission: count the prefix-cache lookup once
                self.block_pool.prefix_cache_stats.record(request.num_tokens, num_new_computed_tokens)
        if hit is not None:
            for group, blocks in zip(self.groups, hit.groups):
                group.attach_hit(req_id, blocks)
        if per_group > 0:
            new = GroupedBlocks([g.allocate(req_id, total_tokens) for g in self.groups], 0)
        else:
            for group in self.groups:
                group.req_to_blocks.setdefault(req_id, [])
            new = self._no_new
        if not delay_cache and self.enable_caching:
            self.cache_blocks(request, total_tokens)
        return new

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Add the request's full blocks within its first ``num_tokens`` tokens to the prefix
        cache, in every group."""
        if not self.enable_caching:
            return
        for group in self.groups:
            group.cache_blocks(request, num_tokens)

    def free(self, request: Request) -> None:
        """Release every block of ``request`` in every group (each group's tail first)."""
        blocks = self.detach(request)
        if blocks:
            self.block_pool.free_blocks(blocks)

    def detach(self, request: Request) -> list[KVCacheBlock]:
        """Take every block away from ``request`` without freeing it, in the order to free them."""
        out: list[KVCacheBlock] = []
        for group in self.groups:
            out.extend(group.detach(request.request_id))
        return out

    # -- queries ------------------------------------------------------------------------------
    def get_blocks(self, request_id: str) -> list[KVCacheBlock]:
        """Group 0's table of the request."""
        return self._first.req_to_blocks.get(request_id, [])

    def get_block_ids(self, request_id: str) -> list[int]:
        """Group 0's block ids of the request (what a single group's would be)."""
        return [b.block_id for b in self._first.req_to_blocks.get(request_id, ())]

    def get_group_block_ids(self, request_id: str) -> list[list[int]]:
        """Every group's block ids of the request (the null block, id 0, where a window left)."""
        return [[b.block_id for b in g.req_to_blocks.get(request_id, ())] for g in self.groups]

    def num_blocks_held(self, request_id: str) -> int:
        """Real blocks (not the null block) the request holds over all groups."""
        return sum(1 for g in self.groups for b in g.req_to_blocks.get(request_id, ()) if not b.is_null)

    def blocks_to_hold(self, num_tokens: int) -> int:
        """The fewest blocks a request of ``num_tokens`` tokens needs at once (its windows slid)."""
        return sum(group_blocks_per_request(g.spec, num_tokens) for g in self.groups)

    @property
    def req_to_blocks(self) -> dict[str, list[KVCacheBlock]]:
        """Group 0's tables (which requests hold blocks)."""
        return self._first.req_to_blocks


register_group_manager(FullAttentionSpec, FullAttentionGroup)
register_group_manager(SlidingWindowSpec, SlidingWindowGroup)
