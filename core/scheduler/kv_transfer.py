"""The scheduler's side of a KV connector: the state a request is in while its KV moves, the
blocks a connector holds, and frees fenced behind steps still in flight.

The :class:`~host.core.scheduler.scheduler.Scheduler` asks this object at the few points of a
step where a connector matters (admission, the plan, a request's end, the step's output); it
keeps nothing else. The order of calls to the connector is the one ``host/sdk/kv_connector.py``
documents.

Block ownership, the part that must never be wrong:

- a request loading asynchronously (``WAITING_FOR_REMOTE_KVS``) owns its blocks; they enter
  the prefix cache only once the load is reported finished and not failed;
- a synchronous load's blocks enter the prefix cache only after the step that loaded them
  reports no load error, so no other request can hit KV that turned out bad;
- a connector that takes over a finished request's blocks (``delay_free``) keeps them until a
  worker reports the request in ``finished_sending``;
- a request finished (aborted) while its load is in flight keeps its blocks until the load is
  reported finished: freeing them earlier would let the transfer write into blocks another
  request got ("rather leak than misuse");
- with steps in flight (asynchronous scheduling, the pipeline's batch queue) a freed block is
  released only after every step planned before the free has been processed.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from host.core.config import KVTransferConfig
from host.interfaces.kv_connector import KVConnector, KVConnectorOutput

if TYPE_CHECKING:
    from host.contracts.request import Request
    from host.core.kv_cache.block_pool import KVCacheBlock
    from host.core.kv_cache.manager import KVCacheManager

logger = logging.getLogger(__name__)


class KVTransferState:
    """One scheduler's connector bookkeeping (see the module docstring)."""

    def __init__(self, connector: KVConnector | None, config: KVTransferConfig | None,
                 kv: "KVCacheManager", fence_frees: bool) -> None:
        self.connector = connector
        self.config = config
        self.kv = kv
        self.block_size = kv.block_size
        self.fail_on_load_error = config is not None and config.kv_load_failure_policy == "fail"
        self.fence_frees = fence_frees
        # WAITING_FOR_REMOTE_KVS requests: the tokens they hold once loaded (prompt - 1 at most)
        self.loading: dict[str, int] = {}
        # loads reported finished, and which of those failed (read at the next admission)
        self.loaded: set[str] = set()
        self.failed: set[str] = set()
        # blocks the connector took over (delay_free) until finished_sending
        self.sending: dict[str, list["KVCacheBlock"]] = {}
        # blocks of requests finished while their load was in flight, until finished_recving
        self.orphaned: dict[str, list["KVCacheBlock"]] = {}
        # sync loads in a step not processed yet: step seq -> {req id: first external block}
        self.sync_loads: dict[int, dict[str, int]] = {}
        # step fences: every planned step's seq until processed; (fence, blocks) awaiting them
        self.scheduled_seq = 0
        self.unprocessed: set[int] = set()
        self.deferred: deque[tuple[int, list["KVCacheBlock"]]] = deque()
        # ids the runner must drop next step (a failed load sent a running request back)
        self.drop_from_runner: set[str] = set()
        self.stats: dict[str, int] = {}

    # -- steps and fences -----------------------------------------------------------------------
    def next_seq(self) -> int:
        self.scheduled_seq += 1
        self.unprocessed.add(self.scheduled_seq)
        return self.scheduled_seq

    def step_processed(self, seq: int) -> None:
        self.unprocessed.discard(seq)
        oldest = min(self.unprocessed) if self.unprocessed else None
        while self.deferred and (oldest is None or self.deferred[0][0] < oldest):
            self.kv.block_pool.free_blocks(self.deferred.popleft()[1])

    def free(self, request: "Request") -> None:
        """Free a request's blocks now, or after the steps in flight (fenced)."""
        self.release(self.kv.detach(request))

    def release(self, blocks: list["KVCacheBlock"]) -> None:
        if not blocks:
            return
        if self.fence_frees and self.unprocessed:
            self.deferred.append((self.scheduled_seq, blocks))
        else:
            self.kv.block_pool.free_blocks(blocks)

    # -- admission --------------------------------------------------------------------------------
    def match(self, request: "Request", num_hit: int) -> tuple[int | None, bool]:
        """External tokens after the local hit (``None``: not known yet), capped at the prompt."""
        if self.connector is None or request.kv_load_failed:
            return 0, False
        num_ext, load_async = self.connector.get_num_new_matched_tokens(request, num_hit)
        if num_ext is None:
            return None, False
        if num_ext < 0:
            raise ValueError(f"KV connector {self.connector.name!r} reported {num_ext} external tokens for {request.request_id!r}")
        return min(num_ext, request.num_tokens - num_hit), bool(load_async)

    def start_async_load(self, request: "Request", num_hit: int, num_ext: int) -> None:
        self.connector.update_state_after_alloc(request, self.kv.get_block_ids(request.request_id), num_ext)
        self.loading[request.request_id] = min(num_hit + num_ext, request.num_tokens - 1)

    def sync_load(self, seq: int, request: "Request", num_hit: int, num_ext: int) -> None:
        self.connector.update_state_after_alloc(request, self.kv.get_block_ids(request.request_id), num_ext)
        self.sync_loads.setdefault(seq, {})[request.request_id] = num_hit // self.block_size

    def loading_sync(self, req_id: str) -> bool:
        """Whether a step not processed yet loads this request's KV (its blocks stay uncached)."""
        return any(req_id in loads for loads in self.sync_loads.values())

    def ready(self, request: "Request") -> bool | None:
        """For a WAITING_FOR_REMOTE_KVS request: None while loading; True once loaded (its
        ``num_computed_tokens`` set, its blocks cached); False when the load failed (its blocks
        freed and its progress reset, to recompute; or failed, per the policy)."""
        req_id = request.request_id
        if req_id not in self.loaded:
            return None
        self.loaded.discard(req_id)
        num_tokens = self.loading.pop(req_id)
        if req_id in self.failed:
            self.failed.discard(req_id)
            return False
        request.num_computed_tokens = num_tokens
        self.kv.cache_blocks(request, num_tokens)
        return True

    def after_failed_load(self, request: "Request", good_tokens: int) -> None:
        """Keep the KV before the first bad block (cached, so the recompute hits it), free the
        rest, and never ask the connector for this request again."""
        self.kv.cache_blocks(request, good_tokens)
        self.free(request)
        request.num_computed_tokens = 0
        request.num_output_placeholders = 0
        request.kv_load_failed = True
        self._count("failed_loads", 1)

    # -- the end of a request -----------------------------------------------------------------
    def finished(self, request: "Request", had_kv: bool, was_loading: bool) -> dict[str, Any] | None:
        """The connector's word on a finished request; frees (or hands over) its blocks.
        Returns the kv_transfer_params for its last output."""
        req_id = request.request_id
        block_ids = self.kv.get_block_ids(req_id) if had_kv else []
        delay, params = self.connector.request_finished(request, block_ids)
        if was_loading and req_id in self.loading:
            # the transfer may still write into these blocks: hold them until it reports
            self.loading.pop(req_id)
            if req_id in self.loaded:  # already reported: nothing in flight
                self.loaded.discard(req_id)
                self.failed.discard(req_id)
                self.free(request)
            else:
                self.orphaned[req_id] = self.kv.detach(request)
        elif delay and block_ids:
            self.sending[req_id] = self.kv.detach(request)
        else:
            self.free(request)
        return params

    # -- the step's report ----------------------------------------------------------------------
    def process_output(self, seq: int, out: KVConnectorOutput | None, requests: dict[str, "Request"]) -> dict[str, int]:
        """Apply one step's aggregated worker report. Returns the sync loads of step ``seq``
        that failed: request id -> tokens before the first bad block (the scheduler sends them
        back to recompute, or fails them)."""
        sync = self.sync_loads.pop(seq, {})
        if out is None:
            out = KVConnectorOutput()
        self.connector.update_connector_output(out)
        for k, v in out.stats.items():
            self._count(k, v)
        for req_id in out.finished_sending:
            blocks = self.sending.pop(req_id, None)
            if blocks is not None:
                self.release(blocks)
        for req_id in out.finished_recving:
            blocks = self.orphaned.pop(req_id, None)
            if blocks is not None:
                self.release(blocks)
            elif req_id in self.loading:
                self.loaded.add(req_id)
                if req_id in out.failed_recving or self._has_bad_block(requests.get(req_id), out.invalid_block_ids):
                    self.failed.add(req_id)
        failed: dict[str, int] = {}
        if out.invalid_block_ids or out.failed_recving:
            for req_id, first_ext in sync.items():
                request = requests.get(req_id)
                if request is None:
                    continue
                bad = self._first_bad_block(request, out.invalid_block_ids)
                if bad is None and req_id in out.failed_recving:
                    bad = first_ext
                if bad is not None:
                    failed[req_id] = bad * self.block_size
        for req_id, first_ext in sync.items():
            request = requests.get(req_id)
            if request is not None and req_id not in failed:
                self.kv.cache_blocks(request, request.num_computed_tokens)
        return failed

    def _first_bad_block(self, request: "Request", invalid: set[int]) -> int | None:
        if not invalid:
            return None
        for i, block_id in enumerate(self.kv.get_block_ids(request.request_id)):
            if block_id in invalid:
                return i
        return None

    def _has_bad_block(self, request: "Request | None", invalid: set[int]) -> bool:
        return request is not None and self._first_bad_block(request, invalid) is not None

    # -- queries ----------------------------------------------------------------------------------
    def has_pending(self) -> bool:
        """Transfers the workers still have to report (the engine keeps stepping for them)."""
        return bool(self.loading or self.sending or self.orphaned)

    def take_stats(self) -> dict[str, int]:
        if self.connector is not None:
            for k, v in self.connector.get_stats().items():
                self._count(k, v)
        return dict(self.stats)

    def _count(self, key: str, n: int) -> None:
        self.stats[key] = self.stats.get(key, 0) + n

    def num_held_blocks(self) -> int:
        """Blocks that are not free and that no running request can give up: handed off to a
        consumer, orphaned by an abort during a load, waiting behind a step fence, or held by
        requests waiting for a remote load. They come back by themselves, so a request that does
        not fit now may fit later."""
        held = sum(len(b) for b in self.sending.values()) + sum(len(b) for b in self.orphaned.values())
        return held + sum(len(b) for _, b in self.deferred) + sum(
            len(self.kv.get_blocks(req_id)) for req_id in self.loading)
