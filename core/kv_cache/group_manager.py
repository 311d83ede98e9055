"""One KV cache group's block tables: the part of the hybrid KV cache manager that depends on the
group's kind (full attention, a sliding window; later latent attention or state-space layers).

Every group keeps, per request, a *positional* table: entry ``i`` is the block holding tokens
``i * block_size .. (i + 1) * block_size - 1`` for the group's layers, or the null block where
the group needs no KV (positions a sliding window has left). All groups' tables of a request
therefore have the same length, and all draw their blocks from one shared
:class:`~host.core.kv_cache.block_pool.BlockPool`. The coordinator
(:class:`~host.core.kv_cache.coordinator.HybridKVCacheManager`) drives them in step.
"""

from __future__ import annotations

from typing import Sequence

from host.contracts.request import BlockHash, Request
from host.core.kv_cache.block_pool import BlockPool, KVCacheBlock
from host.core.kv_cache.spec import KVCacheSpec


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class GroupManager:
    """Block tables of one KV cache group (``group_id``) over the shared ``block_pool``.

    Subclasses say which cached blocks make a prefix hit (:meth:`find_longest_cache_hit`) and
    which blocks a request no longer needs (:meth:`remove_skipped_blocks`)."""

    def __init__(self, spec: KVCacheSpec, group_id: int, block_pool: BlockPool, enable_caching: bool) -> None:
        self.spec = spec
        self.group_id = group_id
        self.block_size = spec.block_size
        self.block_pool = block_pool
        self.enable_caching = enable_caching
        self.null_block = block_pool.null_block
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # how many leading entries of each request's table are in the prefix-cache map (or null)
        self.num_cached_blocks: dict[str, int] = {}

    # -- prefix cache -------------------------------------------------------------------------
    def find_longest_cache_hit(self, block_hashes: Sequence[BlockHash], max_blocks: int) -> list[KVCacheBlock]:
        """The table of the longest prefix hit of at most ``max_blocks`` blocks this group can
        serve (cached blocks, and null blocks where the group needs no KV)."""
        raise NotImplementedError

    def is_cached(self, block_hash: BlockHash) -> KVCacheBlock | None:
        return self.block_pool.get_cached_block(block_hash, self.group_id)

    # -- allocation ---------------------------------------------------------------------------
    def remove_skipped_blocks(self, req_id: str, num_computed_tokens: int) -> None:
        """Free the request's blocks that no token from ``num_computed_tokens`` on will read
        (their entries become the null block). Full attention reads everything: nothing."""

    def num_owned(self, req_id: str) -> int:
        blocks = self.req_to_blocks.get(req_id)
        return len(blocks) if blocks else 0

    def attach_hit(self, req_id: str, hit: Sequence[KVCacheBlock]) -> None:
        """Take references on a prefix hit's blocks and make them the start of the table."""
        self.block_pool.touch(hit)
        self.req_to_blocks[req_id] = list(hit)
        self.num_cached_blocks[req_id] = len(hit)

    def allocate(self, req_id: str, num_tokens: int) -> list[KVCacheBlock]:
        """Grow the request's table to cover ``num_tokens`` tokens; returns the new blocks (the
        caller has checked that the pool has them)."""
        blocks = self.req_to_blocks.get(req_id)
        if blocks is None:
            blocks = self.req_to_blocks[req_id] = []
        n = _cdiv(num_tokens, self.block_size) - len(blocks)
        if n <= 0:
            return []
        new = self.block_pool.get_new_blocks(n)
        blocks.extend(new)
        return new

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Add the full blocks within the request's first ``num_tokens`` tokens to the prefix
        cache under this group's key (null entries are skipped)."""
        req_id = request.request_id
        blocks = self.req_to_blocks.get(req_id)
        if not blocks:
            return
        num_full = min(num_tokens // self.block_size, len(request.block_hashes), len(blocks))
        num_cached = self.num_cached_blocks.get(req_id, 0)
        if num_full > num_cached:
            self.block_pool.cache_full_blocks(blocks, request.block_hashes, num_cached, num_full, self.group_id)
            self.num_cached_blocks[req_id] = num_full

    def detach(self, req_id: str) -> list[KVCacheBlock]:
        """Take the request's table away (tail first: the order to free it in)."""
        blocks = self.req_to_blocks.pop(req_id, None)
        self.num_cached_blocks.pop(req_id, None)
        return list(reversed(blocks)) if blocks else []


_GROUP_MANAGERS: dict[type[KVCacheSpec], type[GroupManager]] = {}


def register_group_manager(spec_cls: type[KVCacheSpec], manager_cls: type[GroupManager]) -> None:
    """Declare that ``manager_cls`` keeps the block tables of a hybrid layout's groups of
    ``spec_cls`` layers (and of its unregistered subclasses)."""
    if not (isinstance(spec_cls, type) and issubclass(spec_cls, KVCacheSpec)):
        raise TypeError(f"{spec_cls!r} is not a KVCacheSpec subclass")
    _GROUP_MANAGERS[spec_cls] = manager_cls


def get_group_manager_class(spec_cls: type[KVCacheSpec]) -> type[GroupManager]:
    """The group manager of ``spec_cls`` or its nearest registered ancestor (MRO order);
    ``ValueError`` when there is none."""
    for klass in spec_cls.__mro__:
        manager = _GROUP_MANAGERS.get(klass)
        if manager is not None:
            return manager
    raise ValueError(
        f"KV cache spec class {spec_cls.__name__} has no hybrid group manager: register one with "
        f"host.core.kv_cache.group_manager.register_group_manager({spec_cls.__name__}, Manager), "
        "or run with --disable-hybrid-kv-cache-manager"
    )
