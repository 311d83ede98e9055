"""The scheduler's view of the KV cache: which blocks each request owns, prefix-cache lookups,
and slot allocation for the tokens scheduled in a step."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from host.contracts.request import Request
from host.core.kv_cache.block_pool import BlockPool, BlockPoolView, KVCacheBlock
from host.core.kv_cache.spec import FullAttentionSpec, KVCacheConfig, KVCacheSpec, SlidingWindowSpec


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager(BlockPoolView):
    """Per-request block tables over one :class:`BlockPool` (a single KV cache group: every layer
    uses the same block ids).

    Build it from a :class:`KVCacheConfig` or from ``num_blocks`` and ``block_size``.
    ``num_blocks`` counts the reserved null block, so ``num_blocks - 1`` blocks are usable.
    A layout of several groups is the :class:`~host.core.kv_cache.coordinator.HybridKVCacheManager`'s
    (:func:`make_kv_cache_manager` picks).
    """

    num_groups = 1
    grouped = False  # new blocks are a plain list (the hybrid manager's are GroupedBlocks)

    def __init__(
        self,
        kv_cache_config: KVCacheConfig | None = None,
        *,
        num_blocks: int | None = None,
        block_size: int | None = None,
        enable_caching: bool = True,
        max_model_len: int | None = None,
    ) -> None:
        if kv_cache_config is not None:
            if kv_cache_config.kv_cache_specs:
                check_kv_cache_specs(kv_cache_config.kv_cache_specs)
            num_blocks = kv_cache_config.num_blocks
            block_size = kv_cache_config.block_size
        if num_blocks is None or block_size is None:
            raise ValueError("KVCacheManager needs a kv_cache_config or both num_blocks and block_size")
        if block_size < 1:
            raise ValueError(f"block_size={block_size} must be >= 1")
        self.kv_cache_config = kv_cache_config
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.max_model_len = max_model_len
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # how many leading blocks of each request are already in the prefix-cache map
        self._num_cached_blocks: dict[str, int] = {}

    # -- prefix cache -------------------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest run of cached full blocks matching the request's prefix, and the number
        of tokens they cover. At most ``num_tokens - 1`` tokens count as a hit: the last token is
        always recomputed to get logits (a fully cached prompt drops its last block). A request
        asking for prompt logprobs gets no hit: it needs the logits of every prompt position.

        Looking up takes no references and counts no stats: pass the blocks to
        :meth:`allocate_slots`, which records the lookup once the request is admitted.
        """
        if not self.enable_caching:
            return [], 0
        if getattr(request.sampling_params, "prompt_logprobs", None) is not None:
            return [], 0  # every prompt position must be computed to score it
        max_hit_blocks = min((request.num_tokens - 1) // self.block_size, len(request.block_hashes))
        hit: list[KVCacheBlock] = []
        get = self.block_pool.get_cached_block
        for block_hash in request.block_hashes[:max_hit_blocks]:
            block = get(block_hash)
            if block is None:
                break
            hit.append(block)
        return hit, len(hit) * self.block_size

    # -- allocation ---------------------------------------------------------------------------
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock] | None = None,
        num_new_computed_tokens: int = 0,
        delay_cache: bool = False,
    ) -> list[KVCacheBlock] | None:
        """Make room for ``num_new_tokens`` more tokens of ``request`` (after its
        ``num_computed_tokens`` plus ``num_new_computed_tokens`` prefix-hit tokens, whose blocks
        are ``new_computed_blocks``). Returns the newly allocated blocks, or None (and changes
        nothing) when there are not enough free blocks.

        Layout: ``| computed | new_computed (prefix hit) | new (computed this step) |``.
        Full blocks among the new tokens are added to the prefix cache right away: their KV is
        written during this step, before any later step could read it. With ``delay_cache``
        they are not (a KV connector fills them, and they are cached by :meth:`cache_blocks` once
        the load is known to be good).
        """
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens={num_new_tokens} must be > 0")
        if not new_computed_blocks:
            # the common case, a running request: fast when its blocks already hold the tokens
            req_blocks = self.req_to_blocks.get(request.request_id)
            if req_blocks:
                total_tokens = request.num_computed_tokens + num_new_tokens
                if total_tokens <= len(req_blocks) * self.block_size and (
                    not self.enable_caching
                    or min(total_tokens // self.block_size, len(request.block_hashes))
                    <= self._num_cached_blocks.get(request.request_id, 0)
                ):
                    return []
        new_computed_blocks = list(new_computed_blocks or ())
        if num_new_computed_tokens != len(new_computed_blocks) * self.block_size:
            raise ValueError(
                f"num_new_computed_tokens={num_new_computed_tokens} does not match "
                f"{len(new_computed_blocks)} prefix-hit blocks of {self.block_size} tokens"
            )
        req_id = request.request_id
        req_blocks = self.req_to_blocks.get(req_id)
        num_owned = len(req_blocks) if req_blocks else 0
        if new_computed_blocks and num_owned:
            raise ValueError(f"request {req_id!r} already owns blocks; prefix hits attach only at admission")

        total_tokens = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        num_new_blocks = _cdiv(total_tokens, self.block_size) - num_owned - len(new_computed_blocks)
        # prefix-hit blocks sitting in the free queue stop being allocatable once touched
        num_evictable_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if num_new_blocks > self.block_pool.get_num_free_blocks() - num_evictable_hits:
            return None

        if req_blocks is None:
            req_blocks = self.req_to_blocks[req_id] = []
            if self.enable_caching:  # admission: count the prefix-cache lookup once
                self.block_pool.prefix_cache_stats.record(request.num_tokens, num_new_computed_tokens)
        if new_computed_blocks:
            self.block_pool.touch(new_computed_blocks)
            req_blocks.extend(new_computed_blocks)
            self._num_cached_blocks[req_id] = len(new_computed_blocks)
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks) if num_new_blocks > 0 else []
        req_blocks.extend(new_blocks)

        if not delay_cache:
            self.cache_blocks(request, total_tokens)
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Add the request's full blocks within its first ``num_tokens`` tokens to the prefix
        cache (those not in it yet)."""
        if not self.enable_caching:
            return
        req_id = request.request_id
        req_blocks = self.req_to_blocks.get(req_id)
        if not req_blocks:
            return
        num_full = min(num_tokens // self.block_size, len(request.block_hashes), len(req_blocks))
        num_cached = self._num_cached_blocks.get(req_id, 0)
        if num_full > num_cached:
            self.block_pool.cache_full_blocks(req_blocks, request.block_hashes, num_cached, num_full)
            self._num_cached_blocks[req_id] = num_full

    def free(self, request: Request) -> None:
        """Release every block of ``request`` (tail first, so its tail is evicted first)."""
        blocks = self.detach(request)
        if blocks:
            self.block_pool.free_blocks(blocks)

    def detach(self, request: Request) -> list[KVCacheBlock]:
        """Take every block away from ``request`` without freeing it, in the order to free them
        (tail first): a KV connector still reading or writing them frees them later."""
        req_id = request.request_id
        blocks = self.req_to_blocks.pop(req_id, None)
        self._num_cached_blocks.pop(req_id, None)
        return list(reversed(blocks)) if blocks else []

    # -- queries ------------------------------------------------------------------------------
    def get_blocks(self, request_id: str) -> list[KVCacheBlock]:
        return self.req_to_blocks.get(request_id, [])

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, ())]

    def get_group_block_ids(self, request_id: str) -> list[list[int]]:
        """The block ids of every KV cache group (here the one)."""
        return [self.get_block_ids(request_id)]

    def num_blocks_held(self, request_id: str) -> int:
        return len(self.req_to_blocks.get(request_id, ()))

    def blocks_to_hold(self, num_tokens: int) -> int:
        """The blocks a request of ``num_tokens`` tokens holds (one per ``block_size`` tokens)."""
        return _cdiv(num_tokens, self.block_size)


# -- spec class -> manager class registry ----------------------------------------------------

_MANAGER_REGISTRY: dict[type[KVCacheSpec], type] = {}


def register_kv_cache_manager(spec_cls: type[KVCacheSpec], manager_cls: type) -> None:
    """Declare that ``manager_cls`` manages the KV cache of layers described by ``spec_cls``
    (and by its subclasses that are not registered themselves)."""
    if not (isinstance(spec_cls, type) and issubclass(spec_cls, KVCacheSpec)):
        raise TypeError(f"{spec_cls!r} is not a KVCacheSpec subclass")
    _MANAGER_REGISTRY[spec_cls] = manager_cls


def get_manager_class(spec_cls: type[KVCacheSpec]) -> type:
    """The manager registered for ``spec_cls`` or its nearest registered ancestor (MRO order).

    Raises ``ValueError`` (not an assert: it must survive ``python -O``) for an unregistered class.
    """
    for klass in spec_cls.__mro__:
        manager = _MANAGER_REGISTRY.get(klass)
        if manager is not None:
            return manager
    raise ValueError(
        f"KV cache spec class {spec_cls.__name__} has no KV cache manager: register one with "
        f"host.core.kv_cache.manager.register_kv_cache_manager({spec_cls.__name__}, ManagerClass), "
        f"or subclass a registered spec such as FullAttentionSpec"
    )


def check_kv_cache_specs(specs: Iterable[KVCacheSpec]) -> type:
    """Start-up check: every layer's spec has a manager, all layers share one manager class and
    one block size. Returns that manager class."""
    specs = list(specs)
    if not specs:
        raise ValueError("the model has no KV cache layers (empty spec list)")
    managers = {get_manager_class(type(s)) for s in specs}
    if len(managers) > 1:
        names = sorted(m.__name__ for m in managers)
        raise ValueError(
            f"layers need different KV cache managers ({', '.join(names)}) but share one KV cache group; "
            "a hybrid KV cache layout groups them by kind (register a group manager with "
            "host.core.kv_cache.group_manager.register_group_manager)"
        )
    block_sizes = {s.block_size for s in specs}
    if len(block_sizes) > 1:
        raise ValueError(f"all KV cache layers must share one block_size, got {sorted(block_sizes)}")
    return managers.pop()



def make_kv_cache_manager(kv_cache_config: KVCacheConfig, *, enable_caching: bool = True,
                          max_model_len: int | None = None) -> "KVCacheManager | Any":
    """The manager for ``kv_cache_config``: the hybrid coordinator when its layout has several
    groups or a sliding-window group, else the single-group :class:`KVCacheManager`."""
    layout = kv_cache_config.layout
    if layout is not None and (layout.is_hybrid or layout.frees_windows):
        from host.core.kv_cache.coordinator import HybridKVCacheManager

        return HybridKVCacheManager(kv_cache_config, enable_caching=enable_caching, max_model_len=max_model_len)
    return KVCacheManager(kv_cache_config, enable_caching=enable_caching, max_model_len=max_model_len)


register_kv_cache_manager(FullAttentionSpec, KVCacheManager)
# with one KV cache group, sliding-window layers are allocated like full attention
register_kv_cache_manager(SlidingWindowSpec, KVCacheManager)
