"""The scheduler's side of a KV connector: the state a request is in while its KV moves, the
blocks a connector holds, and frees fenced behind steps still in flight.

:class:`KVTransferFeature` is both the feature's seam into the scheduler
(:class:`~host.core.scheduler.feature.SchedulerFeature`: admission of requests whose load was in
flight, the plan's connector metadata, the step's transfer report, the connector's stats) and the
scheduler's :class:`~host.core.scheduler.kv_source.KVSource` (external tokens at admission, and
frees that a connector may take over or that wait behind steps in flight). The order of calls to the connector is the one ``host/interfaces/kv_connector.py``
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

from host.contracts.request import RequestStatus
from host.core.config import KVTransferConfig
from host.core.scheduler.feature import WAIT, SchedulerFeature
from host.core.scheduler.kv_source import KVSource
from host.interfaces.kv_connector import KVConnector, KVConnectorOutput

if TYPE_CHECKING:
    from host.contracts.messages import SchedulerStats
    from host.contracts.request import Request
    from host.contracts.runner_output import ModelRunnerOutput
    from host.contracts.scheduler_output import SchedulerOutput
    from host.core.kv_cache.block_pool import KVCacheBlock
    from host.core.kv_cache.manager import KVCacheManager

logger = logging.getLogger(__name__)


class KVTransferFeature(SchedulerFeature, KVSource):
    """One scheduler's connector bookkeeping (see the module docstring)."""

    name = "kv_transfer"
    hashes_blocks = True  # the connector keys external blocks by the same chained hashes

    def __init__(self, connector: KVConnector | None, config: KVTransferConfig | None,
                 kv: "KVCacheManager", fence_frees: bool) -> None:
        KVSource.__init__(self, kv)
        self.connector = connector
        self.config = config
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
        self.counts: dict[str, int] = {}

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
        self.release_blocks(self.kv.detach(request))

    def release_blocks(self, blocks: list["KVCacheBlock"]) -> None:
        if not blocks:
            return
        if self.fence_frees and self.unprocessed:
            self.deferred.append((self.scheduled_seq, blocks))
        else:
            self.kv.block_pool.free_blocks(blocks)

    # -- admission --------------------------------------------------------------------------------
    def admit(self, request: "Request") -> str | None:
        """A request whose asynchronous load was in flight: it waits until the load is reported;
        a failed load is recomputed from the prompt, or fails it (kv_load_failure_policy=fail)."""
        if request.status != RequestStatus.WAITING_FOR_REMOTE_KVS:
            return None
        loaded = self.ready(request)
        if loaded is None:  # still loading: the batch goes on without it
            return WAIT
        request.status = RequestStatus.WAITING
        if not loaded:
            if self.fail_on_load_error:
                return self.load_error(request)
            logger.warning("request %s: its remote KV load failed; recomputing the prompt", request.request_id)
            self.after_failed_load(request, 0)
        return None

    def load_error(self, request: "Request") -> str:
        return (
            f"loading the KV cache of request {request.request_id} through the KV connector "
            f"{self.connector.name!r} failed (kv_load_failure_policy=fail; 'recompute' computes it instead)"
        )

    def external_tokens(self, request: "Request", num_hit: int) -> tuple[int | None, bool]:
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

    def sync_load(self, request: "Request", num_hit: int, num_ext: int) -> None:
        self.connector.update_state_after_alloc(request, self.kv.get_block_ids(request.request_id), num_ext)
        # the step being planned (its seq is the next one) loads it
        self.sync_loads.setdefault(self.scheduled_seq + 1, {})[request.request_id] = num_hit // self.block_size

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
    def release(self, request: "Request", was: RequestStatus) -> dict[str, Any] | None:
        """The connector's word on a finished request; frees (or hands over) its blocks.
        Returns the kv_transfer_params for its last output. Only a request that was running
        holds computed KV a producer may hand off, and an aborted one hands nothing off (its KV
        may be incomplete)."""
        had_kv = was == RequestStatus.RUNNING and request.status != RequestStatus.FINISHED_ABORTED
        was_loading = was == RequestStatus.WAITING_FOR_REMOTE_KVS
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

    # -- the step ------------------------------------------------------------------------------
    def plan(self, output: "SchedulerOutput") -> None:
        """Number the step (the fences), drop requests a failed load sent back, and add the
        connector's metadata."""
        output.step_seq = self.next_seq()
        output.preempted_req_ids |= self.drop_from_runner
        self.drop_from_runner = set()
        output.kv_connector_metadata = self.connector.build_connector_meta(output)

    def take_result(self, scheduler_output: "SchedulerOutput", runner_output: "ModelRunnerOutput") -> None:
        """The workers' transfer report for this step: free what was handed off, mark loads
        done, and send requests whose synchronous load failed back to recompute from their
        first bad block (their sample from this step is void), or fail them."""
        scheduler = self.scheduler
        failed = self.process_output(scheduler_output.step_seq, runner_output.kv_connector_output, scheduler.requests)
        for req_id, good_tokens in failed.items():
            request = scheduler.requests[req_id]
            if request.status != RequestStatus.RUNNING:
                continue
            if self.fail_on_load_error:
                scheduler.fail_running(request, self.load_error(request))
                continue
            logger.warning("request %s: its KV load failed; recomputing from token %d", req_id, good_tokens)
            self.after_failed_load(request, good_tokens)
            self.drop_from_runner.add(req_id)
            scheduler.requeue(request)

    def step_done(self, scheduler_output: "SchedulerOutput") -> None:
        self.step_processed(scheduler_output.step_seq)

    def stats(self, stats: "SchedulerStats", running: list["Request"], waiting: Any) -> None:
        stats.kv_connector_stats = self.take_stats()

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
                self.release_blocks(blocks)
        for req_id in out.finished_recving:
            blocks = self.orphaned.pop(req_id, None)
            if blocks is not None:
                self.release_blocks(blocks)
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
        return dict(self.counts)

    def _count(self, key: str, n: int) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def num_held_blocks(self) -> int:
        """Blocks that are not free and that no running request can give up: handed off to a
        consumer, orphaned by an abort during a load, waiting behind a step fence, or held by
        requests waiting for a remote load. They come back by themselves, so a request that does
        not fit now may fit later."""
        held = sum(len(b) for b in self.sending.values()) + sum(len(b) for b in self.orphaned.values())
        return held + sum(len(b) for _, b in self.deferred) + sum(
            len(self.kv.get_blocks(req_id)) for req_id in self.loading)
