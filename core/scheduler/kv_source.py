"""Where a waiting request's computed KV comes from, and who frees a request's blocks.

The default :class:`KVSource` knows only the local prefix cache (the scheduler's own lookup)
and frees a request's blocks at once. A feature that brings KV from elsewhere or holds blocks
past a request's end (the KV transfer feature, :mod:`host.core.kv_transfer.scheduler`; later a
CPU offload tier) subclasses it, and the scheduler uses that one instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from host.contracts.request import Request, RequestStatus
    from host.core.kv_cache.manager import KVCacheManager


class KVSource:
    """The local prefix cache only; blocks are freed as soon as a request lets them go."""

    hashes_blocks = False
    """Whether requests need block hashes even without prefix caching (a connector keys KV by them)."""

    def __init__(self, kv: "KVCacheManager") -> None:
        self.kv = kv

    def external_tokens(self, request: "Request", num_hit: int) -> tuple[int | None, bool]:
        """Tokens after the local hit that come from elsewhere (``None``: not known yet, ask
        next step) and whether they load asynchronously."""
        return 0, False

    def start_async_load(self, request: "Request", num_hit: int, num_ext: int) -> None:
        """``request`` (its blocks allocated) waits in ``WAITING_FOR_REMOTE_KVS`` for ``num_ext`` tokens."""
        raise NotImplementedError("the local prefix cache loads nothing")

    def sync_load(self, request: "Request", num_hit: int, num_ext: int) -> None:
        """``request``'s ``num_ext`` external tokens are loaded by the step being planned."""
        raise NotImplementedError("the local prefix cache loads nothing")

    def loading_sync(self, req_id: str) -> bool:
        """Whether a step not processed yet loads this request's KV (its new blocks stay uncached)."""
        return False

    def num_held_blocks(self) -> int:
        """Blocks no running request owns that are not free yet (they come back by themselves,
        so a request that does not fit now may fit later)."""
        return 0

    def has_pending(self) -> bool:
        """KV still moving for requests: the engine keeps stepping until it is reported."""
        return False

    def free(self, request: "Request") -> None:
        """Free a preempted (or failed-load) request's blocks."""
        self.kv.free(request)

    def release(self, request: "Request", was: "RequestStatus") -> dict[str, Any] | None:
        """Free a request that left the scheduler (``was``: its status before). Returns the
        ``kv_transfer_params`` of its last output."""
        self.kv.free(request)
        return None
