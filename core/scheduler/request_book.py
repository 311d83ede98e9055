"""The scheduler's book of requests: who is waiting, running or finished, and every change of
state a request goes through outside the planning of a step (queued, admitted, preempted,
finished, failed, sent back), each freeing or keeping its blocks through the KV source and
telling the features (feature.py). :class:`~host.core.scheduler.scheduler.Scheduler` builds on
it to plan steps and take their results."""

from __future__ import annotations

import logging
import time
from typing import Any, Iterable

from host.contracts.messages import EVENT_PREEMPTED, EVENT_QUEUED, EVENT_SCHEDULED, EngineCoreEvent, EngineCoreOutput
from host.contracts.request import Request, RequestStatus
from host.core.kv_cache.manager import KVCacheManager
from host.core.scheduler.feature import SchedulerFeature
from host.core.scheduler.kv_source import KVSource
from host.core.scheduler.limits import check_prompt_fits
from host.core.scheduler.policy import create_request_queue

logger = logging.getLogger(__name__)


class RequestBook:
    """Requests by state, their latency events, and the outputs of requests finished outside a step."""

    def __init__(self, kv_cache_manager: KVCacheManager, max_model_len: int, policy: str,
                 features: Iterable[SchedulerFeature]) -> None:
        self.kv_cache_manager = kv_cache_manager
        self.block_size = kv_cache_manager.block_size
        self.max_model_len = max_model_len
        self.requests: dict[str, Request] = {}
        self.waiting = create_request_queue(policy)
        self.running: list[Request] = []
        # finished since the last schedule(): the runner drops them from its batch next step
        self.finished_req_ids: set[str] = set()
        # outputs of requests finished outside a step's result (reported by update_from_output)
        self._pending_outputs: list[EngineCoreOutput] = []
        self.num_preemptions = 0
        # each request's queued / scheduled / preempted moments not yet sent (the latency metrics)
        self._events: dict[str, list[EngineCoreEvent]] = {}
        self.features: list[SchedulerFeature] = list(features)
        for feature in self.features:
            feature.bind(self)
        # where external KV comes from and who frees blocks: a feature's own source, or the local cache
        self.kv_source: KVSource = next((f for f in self.features if isinstance(f, KVSource)), KVSource(kv_cache_manager))
        self._block_hasher: Any = None  # set by the scheduler when blocks are hashed

    def feature(self, name: str) -> SchedulerFeature | None:
        """The feature of that name, if it runs (``"spec_decode"``, ``"lora"``, ``"kv_transfer"``, ...)."""
        return next((f for f in self.features if f.name == name), None)

    # -- requests in and out ------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a request. Raises ValueError for a duplicate id, an empty prompt, or a prompt
        longer than ``max_model_len`` or than the whole KV cache."""
        req_id = request.request_id
        if req_id in self.requests:
            raise ValueError(f"request id {req_id!r} is already in use; request ids must be unique")
        check_prompt_fits(request, self.max_model_len, self.kv_cache_manager)
        if self._block_hasher is not None:
            if request.block_hasher is None:
                request.set_block_hasher(self._block_hasher)
            elif getattr(request.block_hasher, "block_size", self.block_size) != self.block_size:
                raise ValueError(
                    f"request {req_id!r} hashes blocks of {request.block_hasher.block_size} tokens "
                    f"but the KV cache uses block_size={self.block_size}; leave block_hasher unset"
                )
        request.status = RequestStatus.WAITING
        for feature in self.features:
            feature.added(request)
        self.requests[req_id] = request
        self.waiting.add_request(request)
        self._events[req_id] = [EngineCoreEvent(EVENT_QUEUED, time.monotonic())]

    def finish_requests(self, request_ids: str | Iterable[str], finished_status: RequestStatus) -> None:
        """Finish requests from outside (abort, a stop string found by the detokenizer): their
        blocks are freed now. Unknown or already finished ids are ignored."""
        if not finished_status.is_finished:
            raise ValueError(f"finished_status={finished_status.name} is not a finished status")
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        running_ids: set[str] = set()
        waiting: list[Request] = []
        for req_id in request_ids:
            request = self.requests.get(req_id)
            if request is None:
                continue
            was = request.status
            if was == RequestStatus.RUNNING:
                running_ids.add(req_id)
            else:
                waiting.append(request)
            request.status = finished_status
            self._free_request(request, was)
        if running_ids:
            self.running = [r for r in self.running if r.request_id not in running_ids]
        if waiting:
            self.waiting.remove_requests(waiting)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running) or bool(self.waiting)

    def has_pending_kv_transfers(self) -> bool:
        """KV a connector still moves for requests (loads in flight, blocks held for a consumer):
        the engine keeps stepping, idle or not, until the workers report them."""
        return self.kv_source.has_pending()

    def has_finished_requests(self) -> bool:
        """Finished ids not yet sent to the runner (a step is needed to tell it)."""
        return bool(self.finished_req_ids) or bool(self._pending_outputs)

    def get_num_unfinished_requests(self) -> int:
        return len(self.running) + len(self.waiting)

    def reset_prefix_cache(self) -> bool:
        return self.kv_cache_manager.reset_prefix_cache()

    def _start_running(self, request: Request, num_computed: int) -> None:
        request.num_computed_tokens = num_computed
        if request.num_cached_tokens < 0:
            request.num_cached_tokens = num_computed
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        for feature in self.features:
            feature.admitted(request)
        self._events.setdefault(request.request_id, []).append(EngineCoreEvent(EVENT_SCHEDULED, time.monotonic()))

    # -- what features may do to requests ------------------------------------------------------
    def requeue(self, request: Request) -> None:
        """Send a running request back to the front of the waiting queue (its blocks already
        freed by the caller, its progress reset): it is admitted again like a new request."""
        self.running.remove(request)
        request.status = RequestStatus.WAITING
        self.waiting.prepend_request(request)

    def fail_running(self, request: Request, error: str) -> None:
        """Finish a running request with ``error`` (it goes out with its final output)."""
        self.running.remove(request)
        self._fail_request(request, error, was=RequestStatus.RUNNING)

    # -- internals ----------------------------------------------------------------------------
    def _preempt_request(self, request: Request) -> None:
        """Recompute preemption: free the blocks, forget progress, requeue at the front."""
        self.kv_source.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_output_placeholders = 0  # a token in flight is dropped: it is recomputed
        request.num_preemptions += 1
        self.num_preemptions += 1
        self._events.setdefault(request.request_id, []).append(EngineCoreEvent(EVENT_PREEMPTED, time.monotonic()))
        self.waiting.prepend_request(request)

    def _cap_for_kv_exhaustion(self, request: Request) -> None:
        """Finish a request that cannot fit in the whole KV cache (only possible when the cache
        is smaller than one max_model_len request, e.g. with num_gpu_blocks_override)."""
        logger.warning(
            "request %s needs more KV cache blocks than exist (%d tokens, %d usable blocks of %d); "
            "finishing it with reason 'length'. Raise --kv-cache-memory or lower --max-model-len.",
            request.request_id,
            request.num_tokens,
            self.kv_cache_manager.num_blocks - 1,
            self.block_size,
        )
        was = request.status
        if was == RequestStatus.RUNNING:
            self.running.remove(request)
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        self._free_request(request, was)
        self._pending_outputs.append(
            EngineCoreOutput(
                req_id=request.request_id,
                new_token_ids=[],
                finish_reason="length",
                num_cached_tokens=max(request.num_cached_tokens, 0),
            )
        )

    def _fail_request(self, request: Request, error: str, was: RequestStatus = RequestStatus.WAITING) -> None:
        """Finish a request that cannot run (its grammar did not compile, its KV load failed
        under kv_load_failure_policy=fail); the error goes out with its final output."""
        request.status = RequestStatus.FINISHED_ABORTED
        self._free_request(request, was)
        self._pending_outputs.append(
            EngineCoreOutput(req_id=request.request_id, new_token_ids=[], finish_reason="abort", error=error)
        )

    def _free_request(self, request: Request, was: RequestStatus = RequestStatus.RUNNING) -> dict[str, Any] | None:
        """Forget a finished request and free its blocks (or let the KV source, a connector,
        take them over). ``was`` is its status before it finished. Returns the KV source's
        kv_transfer_params for its last output."""
        self._events.pop(request.request_id, None)
        for feature in self.features:
            feature.finished(request, was)
        params = self.kv_source.release(request, was)
        del self.requests[request.request_id]
        self.finished_req_ids.add(request.request_id)
        return params
