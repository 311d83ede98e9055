"""The scheduler: each step, decide which requests run and how many tokens each computes.

There is no prefill or decode phase: a request has ``num_computed_tokens`` chasing
``num_tokens``, and one token budget (``max_num_batched_tokens``) is shared by all of them.
Running requests are served first (so decodes are never starved by new prefills), then waiting
requests are admitted in policy order. When the KV cache runs out, running requests are
preempted by recompute: their blocks are freed and they go back to the front of the waiting
queue (the prefix cache usually still holds most of their blocks when they resume).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Container, Iterable

from host.contracts.messages import (
    EVENT_PREEMPTED,
    EVENT_QUEUED,
    EVENT_SCHEDULED,
    EngineCoreEvent,
    EngineCoreOutput,
    EngineCoreOutputs,
    SchedulerStats,
)
from host.contracts.request import Request, RequestStatus
from host.contracts.runner_output import ModelRunnerOutput
from host.contracts.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput
from host.core.config import CacheConfig, SchedulerConfig
from host.core.kv_cache.block_pool import KVCacheBlock
from host.core.kv_cache.hashing import make_block_hasher
from host.core.kv_cache.manager import KVCacheManager
from host.core.scheduler.kv_transfer import KVTransferState
from host.core.scheduler.lora_admission import LoRAAdmission, lora_stats
from host.core.scheduler.policy import create_request_queue
from host.core.scheduler.pooling import finish_pooled
from host.core.scheduler.spec_decode import SpecDecodeScheduling

logger = logging.getLogger(__name__)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Scheduler:
    """Continuous-batching scheduler over one :class:`KVCacheManager`.

    ``schedule()`` plans a step, the executor runs it, ``update_from_output()`` appends the
    sampled tokens, applies stop conditions and frees finished requests' blocks.
    """

    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        kv_cache_manager: KVCacheManager,
        send_token_ids: bool = False,
        kv_connector: Any = None,
        kv_transfer_config: Any = None,
        steps_in_flight: bool = False,
        lora_config: Any = None,
        speculative_config: Any = None,
    ) -> None:
        if cache_config.block_size != kv_cache_manager.block_size:
            raise ValueError(
                f"cache_config.block_size={cache_config.block_size} differs from the KV cache "
                f"manager's block_size={kv_cache_manager.block_size}"
            )
        if (
            not scheduler_config.enable_chunked_prefill
            and scheduler_config.max_num_batched_tokens < scheduler_config.max_model_len
            and not getattr(scheduler_config, "whole_prompts", False)  # a pooling model's front end checks it
        ):
            raise ValueError(
                f"max_num_batched_tokens={scheduler_config.max_num_batched_tokens} is smaller than "
                f"max_model_len={scheduler_config.max_model_len}, so a long prompt could never be "
                "scheduled without chunked prefill; enable chunked prefill or raise "
                "--max-num-batched-tokens to at least max_model_len"
            )
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.kv_cache_manager = kv_cache_manager
        self.block_size = kv_cache_manager.block_size
        self.max_model_len = scheduler_config.max_model_len
        self.max_num_running_reqs = scheduler_config.max_num_seqs
        self.max_num_scheduled_tokens = scheduler_config.max_num_batched_tokens

        self.requests: dict[str, Request] = {}
        self.waiting = create_request_queue(scheduler_config.policy)
        self.running: list[Request] = []
        # finished since the last schedule(): the runner drops them from its batch next step
        self.finished_req_ids: set[str] = set()
        # outputs of requests the scheduler itself finished (reported by update_from_output)
        self._pending_outputs: list[EngineCoreOutput] = []
        self.num_preemptions = 0
        # each request's queued / scheduled / preempted moments not yet sent (the latency metrics)
        self._events: dict[str, list[EngineCoreEvent]] = {}
        # a KV connector keys external blocks by the same chained hashes
        hashing = kv_cache_manager.enable_caching or kv_connector is not None
        self._block_hasher = make_block_hasher(self.block_size) if hashing else None
        # the KV connector's scheduler role and its state (None without --kv-transfer-config);
        # with steps in flight (asynchronous scheduling, pipeline) frees wait for them
        self.kv_transfer = (
            KVTransferState(kv_connector, kv_transfer_config, kv_cache_manager, steps_in_flight)
            if kv_connector is not None else None
        )
        self.num_prompt_tokens_computed = 0  # prompt tokens run through the model (not cache hits)
        # pipeline parallelism: the first stage never sees sampled tokens, so the plan carries
        # each running request's input tokens (CachedRequestData.new_token_ids)
        self.send_token_ids = send_token_ids
        # --enable-lora: the running requests use at most max_loras adapters (lora_admission.py)
        self.lora_admission = LoRAAdmission(lora_config.max_loras) if lora_config is not None else None
        # --speculative-config: draft trimming, rollback, acceptance counts (spec_decode.py)
        self.spec_decode = SpecDecodeScheduling(speculative_config, self.max_model_len) if speculative_config is not None else None

    # -- requests in and out ------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a request. Raises ValueError for a duplicate id, an empty prompt, or a prompt
        longer than ``max_model_len`` or than the whole KV cache."""
        req_id = request.request_id
        if req_id in self.requests:
            raise ValueError(f"request id {req_id!r} is already in use; request ids must be unique")
        n = request.num_prompt_tokens
        if n == 0:
            raise ValueError(f"request {req_id!r} has an empty prompt; send at least one token")
        if n > self.max_model_len:
            raise ValueError(
                f"request {req_id!r} has {n} prompt tokens, more than max_model_len="
                f"{self.max_model_len}; shorten the prompt or raise --max-model-len"
            )
        usable = self.kv_cache_manager.num_blocks - 1
        if _cdiv(n, self.block_size) > usable:
            raise ValueError(
                f"request {req_id!r} has {n} prompt tokens but the KV cache holds only {usable} "
                f"blocks of {self.block_size} tokens; raise --kv-cache-memory or shorten the prompt"
            )
        if self._block_hasher is not None:
            if request.block_hasher is None:
                request.set_block_hasher(self._block_hasher)
            elif getattr(request.block_hasher, "block_size", self.block_size) != self.block_size:
                raise ValueError(
                    f"request {req_id!r} hashes blocks of {request.block_hasher.block_size} tokens "
                    f"but the KV cache uses block_size={self.block_size}; leave block_hasher unset"
                )
        if request.structured_output is not None:
            request.status = RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
        else:
            request.status = RequestStatus.WAITING
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
        return self.kv_transfer is not None and self.kv_transfer.has_pending()

    def has_finished_requests(self) -> bool:
        """Finished ids not yet sent to the runner (a step is needed to tell it)."""
        return bool(self.finished_req_ids) or bool(self._pending_outputs)

    def get_num_unfinished_requests(self) -> int:
        return len(self.running) + len(self.waiting)

    def reset_prefix_cache(self) -> bool:
        return self.kv_cache_manager.reset_prefix_cache()

    # -- one step -----------------------------------------------------------------------------
    def schedule(self, in_flight: Container[str] = frozenset(), max_num_reqs: int | None = None) -> SchedulerOutput:
        """Plan one step within the token budget (running requests first, then waiting ones).

        Requests in ``in_flight`` (in a launched step whose output is not processed yet: the
        pipeline's batch queue) sit this step out, running or preempted; ``max_num_reqs`` caps
        the requests of this step (the batch queue splits them over the pipeline's steps)."""
        req_limit = self.max_num_running_reqs if max_num_reqs is None else max_num_reqs
        cfg = self.scheduler_config
        chunked = cfg.enable_chunked_prefill
        kv = self.kv_cache_manager
        token_budget = self.max_num_scheduled_tokens
        num_scheduled: dict[str, int] = {}
        new_blocks_of: dict[str, list[KVCacheBlock]] = {}
        scheduled_running: list[Request] = []
        scheduled_new: list[Request] = []
        preempted: list[Request] = []
        spec_tokens: dict[str, list[int]] = {}  # the drafts each decode verifies this step

        threshold = cfg.long_prefill_token_threshold if chunked else 0
        if len(self.running) + len(self.waiting) <= 1:
            threshold = 0  # nobody to starve
        # prefill chunks leave one token for every decode behind them in the running list
        decodes_behind = sum(1 for r in self.running if r.num_tokens_planned - r.num_computed_tokens == 1)

        # 1. running requests
        req_index = 0
        while req_index < len(self.running) and token_budget > 0 and len(num_scheduled) < req_limit:
            request = self.running[req_index]
            remaining = request.num_tokens_planned - request.num_computed_tokens
            is_decode = remaining == 1
            if request.request_id in in_flight or (request.num_output_placeholders and self._done_once_returned(request)):
                # in an unprocessed step of the pipeline, or its token in flight reaches
                # max_tokens / max_model_len: nothing more to run now
                if is_decode:
                    decodes_behind -= 1
                req_index += 1
                continue
            if is_decode:
                decodes_behind -= 1
            num_new = min(remaining, self.max_model_len - request.num_computed_tokens)
            if threshold > 0:
                num_new = min(num_new, threshold)
            num_new = min(num_new, token_budget - (0 if is_decode else decodes_behind))
            if num_new <= 0 or (not chunked and num_new < remaining):
                req_index += 1
                continue
            drafts = self.spec_decode.drafts_for(request, token_budget, len(self.running)) if self.spec_decode and is_decode else []
            num_new += len(drafts)

            new_blocks = None
            delay_cache = self.kv_transfer is not None and self.kv_transfer.loading_sync(request.request_id)
            # a model drafter writes KV up to kv_lookahead slots past this step's tokens: room for them when free
            ahead = min(self.spec_decode.spec.kv_lookahead, self.max_model_len - request.num_computed_tokens - num_new) if self.spec_decode else 0
            while True:
                new_blocks = kv.allocate_slots(request, num_new + ahead, delay_cache=delay_cache) if ahead > 0 else None
                if new_blocks is None:
                    new_blocks = kv.allocate_slots(request, num_new, delay_cache=delay_cache)
                if new_blocks is not None:
                    break
                victim = self.waiting.select_victim(self.running)
                if victim is request and len(self.running) == 1:
                    if self._blocks_held_elsewhere():
                        break  # a KV connector still holds blocks: wait for them this step
                    # alone and still out of blocks: it can never grow further
                    self._cap_for_kv_exhaustion(request)
                    break
                idx = self.running.index(victim)
                del self.running[idx]
                if idx < req_index:
                    req_index -= 1
                elif idx > req_index and victim.num_tokens_planned - victim.num_computed_tokens == 1:
                    decodes_behind -= 1
                if victim.request_id in num_scheduled:
                    # scheduled earlier in this step: give its tokens back to the budget
                    token_budget += num_scheduled.pop(victim.request_id)
                    spec_tokens.pop(victim.request_id, None)
                    new_blocks_of.pop(victim.request_id, None)
                    scheduled_running.remove(victim)
                self._preempt_request(victim)
                preempted.append(victim)
                if victim is request:
                    break
            if new_blocks is None:
                break
            scheduled_running.append(request)
            new_blocks_of[request.request_id] = new_blocks
            num_scheduled[request.request_id] = num_new
            if drafts:
                spec_tokens[request.request_id] = drafts
            token_budget -= num_new
            req_index += 1

        # 2. waiting requests (not in a step that had to preempt: memory is short)
        skipped: list[Request] = []  # still compiling their grammar: stay queued, in order
        if self.lora_admission is not None:
            self.lora_admission.begin(self.running)
        if not preempted:
            while (self.waiting and token_budget > 0 and len(self.running) < self.max_num_running_reqs
                   and len(num_scheduled) < req_limit):
                request = self.waiting.peek_request()
                if request.request_id in in_flight:  # preempted while its step is unprocessed
                    skipped.append(self.waiting.pop_request())
                    continue
                if request.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR:
                    if not request.structured_output.ready():
                        skipped.append(self.waiting.pop_request())
                        continue
                    if request.structured_output.error is not None:
                        self.waiting.pop_request()
                        self._fail_request(request, request.structured_output.error)
                        continue
                    request.status = RequestStatus.WAITING
                if self.lora_admission is not None and not self.lora_admission.admits(request):
                    skipped.append(self.waiting.pop_request())  # one adapter too many: waits in place
                    continue
                num_ext, load_async = 0, False
                if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                    loaded = self.kv_transfer.ready(request)
                    if loaded is None:  # still loading: the batch goes on without it
                        skipped.append(self.waiting.pop_request())
                        continue
                    request.status = RequestStatus.WAITING
                    if not loaded and not self._after_failed_remote_load(request):
                        continue  # failed, per kv_load_failure_policy=fail
                if kv.get_blocks(request.request_id):
                    hit_blocks, num_hit = [], request.num_computed_tokens  # loaded by a connector
                else:
                    hit_blocks, num_hit = kv.get_computed_blocks(request)
                    if self.kv_transfer is not None:
                        num_ext, load_async = self.kv_transfer.match(request, num_hit)
                        if num_ext is None:  # the connector does not know yet: ask next step
                            skipped.append(self.waiting.pop_request())
                            continue
                if num_ext and load_async:
                    if kv.allocate_slots(request, num_ext, hit_blocks, num_hit, delay_cache=True) is None:
                        break
                    self.waiting.pop_request()
                    request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                    self.kv_transfer.start_async_load(request, num_hit, num_ext)
                    skipped.append(request)
                    continue
                # a synchronous load fills its blocks in this very step; the prompt's last token
                # is always computed (its logits)
                num_loaded = min(num_ext, request.num_tokens - 1 - num_hit)
                num_new = request.num_tokens - num_hit - num_loaded
                if chunked:
                    if threshold > 0:
                        num_new = min(num_new, threshold)
                    num_new = min(num_new, token_budget)
                elif num_new > token_budget:
                    break
                ahead = 0 if num_ext or not self.spec_decode else min(
                    self.spec_decode.spec.kv_lookahead, self.max_model_len - num_hit - num_new)  # as for running requests
                new_blocks = kv.allocate_slots(
                    request, num_new + ahead, hit_blocks, len(hit_blocks) * self.block_size) if ahead > 0 else None
                if new_blocks is None:
                    new_blocks = kv.allocate_slots(
                        request, num_loaded + num_new, hit_blocks, len(hit_blocks) * self.block_size, delay_cache=num_ext > 0
                    )
                if new_blocks is None:
                    if not self.running and not self._blocks_held_elsewhere():
                        # every block is free and it still does not fit: it never will
                        self.waiting.pop_request()
                        self._cap_for_kv_exhaustion(request)
                        continue
                    break
                self.waiting.pop_request()
                if num_ext:
                    self.kv_transfer.sync_load(self.kv_transfer.scheduled_seq + 1, request, num_hit, num_ext)
                    num_hit += num_loaded
                request.num_computed_tokens = num_hit
                if request.num_cached_tokens < 0:
                    request.num_cached_tokens = num_hit
                request.status = RequestStatus.RUNNING
                self.running.append(request)
                if self.lora_admission is not None:
                    self.lora_admission.admit(request)
                scheduled_new.append(request)
                self._events.setdefault(request.request_id, []).append(EngineCoreEvent(EVENT_SCHEDULED, time.monotonic()))
                num_scheduled[request.request_id] = num_new
                token_budget -= num_new

        for request in reversed(skipped):
            self.waiting.prepend_request(request)

        # 3. the plan
        new_reqs = [
            NewRequestData(
                req_id=r.request_id,
                prompt_token_ids=r.prompt_token_ids,
                sampling_params=r.sampling_params,
                block_ids=kv.get_block_ids(r.request_id),
                num_computed_tokens=r.num_computed_tokens,
                output_token_ids=list(r.output_token_ids),
                eos_token_id=r.eos_token_id,
                lora_request=r.lora_request,
                pooling_params=r.pooling_params,
            )
            for r in scheduled_new
        ]
        cached = CachedRequestData(
            req_ids=[r.request_id for r in scheduled_running],
            new_block_ids=[[b.block_id for b in new_blocks_of[r.request_id]] for r in scheduled_running],
            num_computed_tokens=[r.num_computed_tokens for r in scheduled_running],
        )
        if self.send_token_ids:
            cached.new_token_ids = [
                r.all_token_ids[r.num_computed_tokens : r.num_computed_tokens + num_scheduled[r.request_id]]
                for r in scheduled_running
            ]
        output = SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=sum(num_scheduled.values()),
            finished_req_ids=self.finished_req_ids,
            preempted_req_ids={r.request_id for r in preempted},
            scheduled_spec_decode_tokens=spec_tokens,
        )
        self.finished_req_ids = set()
        if self.kv_transfer is not None:
            output.step_seq = self.kv_transfer.next_seq()
            output.preempted_req_ids |= self.kv_transfer.drop_from_runner
            self.kv_transfer.drop_from_runner = set()
            output.kv_connector_metadata = self.kv_transfer.connector.build_connector_meta(output)
        # the scheduled tokens count as computed from now on (their KV is written this step);
        # a step that reaches a request's last planned token samples its next one
        requests = self.requests
        for req_id, n in num_scheduled.items():
            request = requests[req_id]
            if request.num_computed_tokens < request.num_prompt_tokens:
                self.num_prompt_tokens_computed += min(n, request.num_prompt_tokens - request.num_computed_tokens)
            request.num_computed_tokens += n
            if request.num_computed_tokens >= request.num_tokens_planned:
                request.num_output_placeholders += 1
                output.sampling_req_ids.add(req_id)
        return output

    def _done_once_returned(self, request: Request) -> bool:
        """Whether the tokens in flight already end the request by length (so planning another
        step for it would only be thrown away)."""
        sp = request.sampling_params
        planned_outputs = request.num_output_tokens + request.num_output_placeholders
        return (sp.max_tokens is not None and planned_outputs >= sp.max_tokens) or request.num_tokens_planned >= self.max_model_len

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> EngineCoreOutputs:
        """Append each request's sampled tokens, apply stop conditions, free finished requests.
        Returns one output per request that produced tokens or finished."""
        outputs = self._pending_outputs
        self._pending_outputs = []
        index_of = model_runner_output.req_id_to_index
        sampled_token_ids = model_runner_output.sampled_token_ids
        all_prompt_logprobs = model_runner_output.prompt_logprobs
        all_logprobs = model_runner_output.logprobs
        sampling = scheduler_output.sampling_req_ids
        requests = self.requests
        running = RequestStatus.RUNNING
        if self.kv_transfer is not None:
            self._process_kv_output(scheduler_output, model_runner_output.kv_connector_output)
        stopped: set[str] = set()
        for req_id in scheduler_output.num_scheduled_tokens:
            request = requests.get(req_id)
            if request is None or request.status is not running:
                continue  # finished or preempted since the step was planned
            samples = req_id in sampling
            if samples:
                request.num_output_placeholders -= 1  # its token is here (or the step failed)
            i = index_of.get(req_id)
            if i is None:
                continue
            if request.pooling_params is not None:  # pooled in this one step: it is done
                outputs.append(finish_pooled(request, model_runner_output.pooler_output, self._events.pop(req_id, None)))
                stopped.add(req_id)
                self._free_request(request, running)
                continue
            sampled = sampled_token_ids[i]
            prompt_logprobs = all_prompt_logprobs.get(req_id) if all_prompt_logprobs else None
            # a sample from a prefill chunk that has not reached the end of the prompt is void
            if not sampled or not samples:
                if prompt_logprobs:
                    outputs.append(EngineCoreOutput(
                        req_id=req_id, new_token_ids=[], new_prompt_logprobs=prompt_logprobs, events=self._events.pop(req_id, None)
                    ))
                continue
            new_token_ids: list[int] = []
            for token_id in sampled:
                request.append_output_token_ids(token_id)
                new_token_ids.append(token_id)
                if self._check_stop(request):
                    break
            if self.spec_decode is not None:  # roll back the rejected drafts, take the next ones
                self.spec_decode.after_step(request, scheduler_output, len(sampled), model_runner_output.spec_token_ids, i)
            error = None
            if request.structured_output is not None and not self._accept_structured(request, new_token_ids):
                error = f"token {new_token_ids[-1]} broke the request's structured_outputs grammar"
                logger.error("request %s: %s", req_id, error)
                request.status = RequestStatus.FINISHED_ABORTED
            row_logprobs = all_logprobs[i] if all_logprobs else None
            events = self._events.pop(req_id, None)
            finish_reason = None
            kv_transfer_params = None
            if request.is_finished():
                finish_reason = request.get_finished_reason()
                stopped.add(req_id)
                kv_transfer_params = self._free_request(request, running)
            cached = request.num_cached_tokens
            outputs.append(
                EngineCoreOutput(
                    req_id,
                    new_token_ids,
                    finish_reason,
                    request.stop_reason,
                    cached if cached > 0 else 0,
                    row_logprobs[: len(new_token_ids)] if row_logprobs else None,
                    prompt_logprobs or None,
                    error,
                    events,
                    kv_transfer_params,
                )
            )
        if stopped:
            self.running = [r for r in self.running if r.request_id not in stopped]
        if self.kv_transfer is not None:
            self.kv_transfer.step_processed(scheduler_output.step_seq)
        return EngineCoreOutputs(outputs=outputs, scheduler_stats=self.make_stats())

    # -- KV connector -------------------------------------------------------------------------
    def _process_kv_output(self, scheduler_output: SchedulerOutput, connector_output: Any) -> None:
        """The workers' transfer report for this step: free what was handed off, mark loads
        done, and send requests whose synchronous load failed back to recompute from their
        first bad block (their sample from this step is void), or fail them."""
        failed = self.kv_transfer.process_output(scheduler_output.step_seq, connector_output, self.requests)
        if not failed:
            return
        for req_id, good_tokens in failed.items():
            request = self.requests[req_id]
            if request.status != RequestStatus.RUNNING:
                continue
            self.running.remove(request)
            if self.kv_transfer.fail_on_load_error:
                self._fail_request(request, self._load_error(request), was=RequestStatus.RUNNING)
                continue
            logger.warning("request %s: its KV load failed; recomputing from token %d", req_id, good_tokens)
            self.kv_transfer.after_failed_load(request, good_tokens)
            self.kv_transfer.drop_from_runner.add(req_id)
            request.status = RequestStatus.WAITING
            self.waiting.prepend_request(request)

    def _blocks_held_elsewhere(self) -> bool:
        """Blocks no running request owns that are not free yet: a KV connector holds them for a
        consumer or a transfer, or their free waits for steps in flight."""
        return self.kv_transfer is not None and self.kv_transfer.num_held_blocks() > 0

    def _after_failed_remote_load(self, request: Request) -> bool:
        """A WAITING_FOR_REMOTE_KVS request whose load failed: recompute it (True: it is
        admitted like a new request) or fail it (False), per kv_load_failure_policy."""
        if self.kv_transfer.fail_on_load_error:
            self.waiting.pop_request()
            self._fail_request(request, self._load_error(request))
            return False
        logger.warning("request %s: its remote KV load failed; recomputing the prompt", request.request_id)
        self.kv_transfer.after_failed_load(request, 0)
        return True

    def _load_error(self, request: Request) -> str:
        return (
            f"loading the KV cache of request {request.request_id} through the KV connector "
            f"{self.kv_transfer.connector.name!r} failed (kv_load_failure_policy=fail; 'recompute' computes it instead)"
        )

    # -- stats --------------------------------------------------------------------------------
    def make_stats(self) -> SchedulerStats:
        pc = self.kv_cache_manager.prefix_cache_stats
        return SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting),
            kv_cache_usage=self.kv_cache_manager.usage,
            prefix_cache_queries=pc.queries,
            prefix_cache_hits=pc.hits,
            prefix_cache_hit_rate=pc.hit_rate,
            num_preemptions=self.num_preemptions,
            num_prompt_tokens_computed=self.num_prompt_tokens_computed,
            kv_connector_stats=self.kv_transfer.take_stats() if self.kv_transfer is not None else None,
            spec_decoding=self.spec_decode.totals() if self.spec_decode is not None else None,
            lora_stats=lora_stats(self.lora_admission.max_loras, self.running, self.waiting) if self.lora_admission else None,
            num_waiting_deferred=sum(
                1 for r in self.waiting
                if r.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR and not r.structured_output.ready()
            ),
        )

    # -- internals ----------------------------------------------------------------------------
    def _check_stop(self, request: Request) -> bool:
        """Apply the stop conditions to the token just appended; sets status and stop_reason."""
        sp = request.sampling_params
        output = request.output_token_ids
        num_output = len(output)
        last = output[-1]
        # EOS and stop token ids count only once min_tokens tokens precede them
        if num_output > sp.min_tokens:
            if not sp.ignore_eos and last == request.eos_token_id:
                request.status = RequestStatus.FINISHED_STOPPED
                return True
            if last in sp.stop_token_ids:
                request.status = RequestStatus.FINISHED_STOPPED
                request.stop_reason = last
                return True
        if (sp.max_tokens is not None and num_output >= sp.max_tokens) or len(request.all_token_ids) >= self.max_model_len:
            request.status = RequestStatus.FINISHED_LENGTH_CAPPED
            return True
        return False

    def _preempt_request(self, request: Request) -> None:
        """Recompute preemption: free the blocks, forget progress, requeue at the front."""
        if self.kv_transfer is not None:
            self.kv_transfer.free(request)
        else:
            self.kv_cache_manager.free(request)
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

    @staticmethod
    def _accept_structured(request: Request, token_ids: list[int]) -> bool:
        from host.core.structured_output.engine import StructuredOutputManager

        return StructuredOutputManager.accept_tokens(request, token_ids)

    def _fail_request(self, request: Request, error: str, was: RequestStatus = RequestStatus.WAITING) -> None:
        """Finish a request that cannot run (its grammar did not compile, its KV load failed
        under kv_load_failure_policy=fail); the error goes out with its final output."""
        request.status = RequestStatus.FINISHED_ABORTED
        self._free_request(request, was)
        self._pending_outputs.append(
            EngineCoreOutput(req_id=request.request_id, new_token_ids=[], finish_reason="abort", error=error)
        )

    def _free_request(self, request: Request, was: RequestStatus = RequestStatus.RUNNING) -> dict[str, Any] | None:
        """Forget a finished request and free its blocks (or, with a KV connector, let the
        connector take them over). ``was`` is its status before it finished: only a running
        request holds computed KV a producer may hand off. Returns the connector's
        kv_transfer_params for its last output."""
        self._events.pop(request.request_id, None)
        if self.spec_decode is not None:
            self.spec_decode.forget(request.request_id)
        params = None
        if self.kv_transfer is not None:
            # an aborted request hands nothing off: its KV may be incomplete
            had_kv = was == RequestStatus.RUNNING and request.status != RequestStatus.FINISHED_ABORTED
            params = self.kv_transfer.finished(request, had_kv, was_loading=was == RequestStatus.WAITING_FOR_REMOTE_KVS)
        else:
            self.kv_cache_manager.free(request)
        del self.requests[request.request_id]
        self.finished_req_ids.add(request.request_id)
        return params
