"""The scheduler: each step, decide which requests run and how many tokens each computes.

There is no prefill or decode phase: a request has ``num_computed_tokens`` chasing
``num_tokens``, and one token budget (``max_num_batched_tokens``) is shared by all of them.
Running requests are served first (so decodes are never starved by new prefills), then waiting
requests are admitted in policy order. When the KV cache runs out, running requests are
preempted by recompute: their blocks are freed and they go back to the front of the waiting
queue (the prefix cache usually still holds most of their blocks when they resume).
"""

from __future__ import annotations

from typing import Any, Container, Iterable

from host.contracts.messages import EngineCoreOutput, EngineCoreOutputs, SchedulerStats
from host.contracts.request import Request, RequestStatus
from host.contracts.runner_output import ModelRunnerOutput
from host.contracts.scheduler_output import SchedulerOutput
from host.core.config import CacheConfig, SchedulerConfig
from host.core.kv_cache.hashing import make_block_hasher
from host.core.kv_cache.manager import KVCacheManager
from host.core.scheduler.builtin_features import default_features
from host.core.scheduler.feature import WAIT, SchedulerFeature, overriding
from host.core.scheduler.limits import check_scheduler_config
from host.core.scheduler.request_book import RequestBook
from host.core.scheduler.step_plan import StepPlan
from host.core.scheduler.stop import check_stop


class Scheduler(RequestBook):
    """Continuous-batching scheduler over one :class:`KVCacheManager` (or the hybrid KV cache
    manager, :class:`~host.core.kv_cache.coordinator.HybridKVCacheManager`: the same calls).

    ``schedule()`` plans a step, the executor runs it, ``update_from_output()`` appends the
    sampled tokens, applies stop conditions and frees finished requests' blocks. Features take
    part through their :class:`SchedulerFeature` seam (``features``; by default built from the
    LoRA, speculative and KV-transfer configs, see :func:`default_features`).
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
        features: Iterable[SchedulerFeature] | None = None,
        eplb: bool = False,
    ) -> None:
        check_scheduler_config(scheduler_config, cache_config, kv_cache_manager)
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.max_num_running_reqs = scheduler_config.max_num_seqs
        self.max_num_scheduled_tokens = scheduler_config.max_num_batched_tokens

        # the features' seams (feature.py): drafts, adapters, KV transfer, pooling, grammars
        if features is None:
            features = default_features(
                kv_cache_manager, scheduler_config.max_model_len, kv_connector, kv_transfer_config, steps_in_flight,
                lora_config, speculative_config, eplb,
            )
        RequestBook.__init__(self, kv_cache_manager, scheduler_config.max_model_len, scheduler_config.policy, features)
        self.kv_lookahead = max((f.kv_lookahead for f in self.features), default=0)
        self._admitters = overriding(self.features, "admit")
        self._admission_starters = overriding(self.features, "begin_admissions")
        self._contributors = overriding(self.features, "contribute")
        self._output_takers = overriding(self.features, "take_output")
        self._token_takers = overriding(self.features, "take_tokens")
        hashing = kv_cache_manager.enable_caching or self.kv_source.hashes_blocks
        self._block_hasher = make_block_hasher(self.block_size) if hashing else None
        self.num_prompt_tokens_computed = 0  # prompt tokens run through the model (not cache hits)
        # pipeline parallelism: the first stage never sees sampled tokens, so the plan carries
        # each running request's input tokens (CachedRequestData.new_token_ids)
        self.send_token_ids = send_token_ids

    # -- one step -----------------------------------------------------------------------------
    def schedule(self, in_flight: Container[str] = frozenset(), max_num_reqs: int | None = None) -> SchedulerOutput:
        """Plan one step within the token budget (running requests first, then waiting ones).

        Requests in ``in_flight`` (in a launched step whose output is not processed yet: the
        pipeline's batch queue) sit this step out, running or preempted; ``max_num_reqs`` caps
        the requests of this step (the batch queue splits them over the pipeline's steps)."""
        plan = StepPlan(self.max_num_scheduled_tokens, self.max_num_running_reqs if max_num_reqs is None else max_num_reqs)
        threshold = self.scheduler_config.long_prefill_token_threshold if self.scheduler_config.enable_chunked_prefill else 0
        if len(self.running) + len(self.waiting) <= 1:
            threshold = 0  # nobody to starve
        self._schedule_running(plan, in_flight, threshold)
        for feature in self._admission_starters:
            feature.begin_admissions(self.running)
        if not plan.preempted:  # a step that had to preempt admits nobody: memory is short
            self._schedule_waiting(plan, in_flight, threshold)

        output = plan.output(self.kv_cache_manager, self.finished_req_ids, self.send_token_ids)
        self.finished_req_ids = set()
        for feature in self.features:
            feature.plan(output)
        # the scheduled tokens count as computed from now on (their KV is written this step);
        # a step that reaches a request's last planned token samples its next one
        requests = self.requests
        for req_id, n in plan.num_scheduled.items():
            request = requests[req_id]
            if request.num_computed_tokens < request.num_prompt_tokens:
                self.num_prompt_tokens_computed += min(n, request.num_prompt_tokens - request.num_computed_tokens)
            request.num_computed_tokens += n
            if request.num_computed_tokens >= request.num_tokens_planned:
                request.num_output_placeholders += 1
                output.sampling_req_ids.add(req_id)
        return output

    def _schedule_running(self, plan: StepPlan, in_flight: Container[str], threshold: int) -> None:
        """Give each running request its next tokens (a decode its drafts too), preempting the
        policy's victims when the KV cache is full."""
        chunked = self.scheduler_config.enable_chunked_prefill
        kv = self.kv_cache_manager
        # prefill chunks leave one token for every decode behind them in the running list
        decodes_behind = sum(1 for r in self.running if r.num_tokens_planned - r.num_computed_tokens == 1)
        req_index = 0
        while req_index < len(self.running) and not plan.full():
            request = self.running[req_index]
            remaining = request.num_tokens_planned - request.num_computed_tokens
            is_decode = remaining == 1
            if is_decode:
                decodes_behind -= 1
            if request.request_id in in_flight or (request.num_output_placeholders and self._done_once_returned(request)):
                # in an unprocessed step of the pipeline, or its token in flight reaches
                # max_tokens / max_model_len: nothing more to run now
                req_index += 1
                continue
            num_new = min(remaining, self.max_model_len - request.num_computed_tokens)
            if threshold > 0:
                num_new = min(num_new, threshold)
            num_new = min(num_new, plan.token_budget - (0 if is_decode else decodes_behind))
            if num_new <= 0 or (not chunked and num_new < remaining):
                req_index += 1
                continue
            drafts = self._drafts(request, plan.token_budget) if is_decode else []
            num_new += len(drafts)
            delay_cache = self.kv_source.loading_sync(request.request_id)
            # a model drafter writes KV up to kv_lookahead slots past this step's tokens: room for them when free
            ahead = min(self.kv_lookahead, self.max_model_len - request.num_computed_tokens - num_new)
            while True:
                new_blocks = kv.allocate_slots(request, num_new + ahead, delay_cache=delay_cache) if ahead > 0 else None
                if new_blocks is None:
                    new_blocks = kv.allocate_slots(request, num_new, delay_cache=delay_cache)
                if new_blocks is not None:
                    break
                victim = self.waiting.select_victim(self.running)
                if victim is request and len(self.running) == 1:
                    if self.kv_source.num_held_blocks() > 0:
                        break  # blocks held elsewhere come back by themselves: wait for them
                    self._cap_for_kv_exhaustion(request)  # alone and still out of blocks: it can never grow
                    break
                idx = self.running.index(victim)
                del self.running[idx]
                if idx < req_index:
                    req_index -= 1
                elif idx > req_index and victim.num_tokens_planned - victim.num_computed_tokens == 1:
                    decodes_behind -= 1
                plan.give_back(victim)  # scheduled earlier in this step: its tokens return to the budget
                self._preempt_request(victim)
                plan.preempted.append(victim)
                if victim is request:
                    break
            if new_blocks is None:
                return
            plan.take(request, num_new, running=True, new_blocks=new_blocks)
            if drafts:
                plan.spec_tokens[request.request_id] = drafts
            req_index += 1

    def _schedule_waiting(self, plan: StepPlan, in_flight: Container[str], threshold: int) -> None:
        """Admit waiting requests in policy order while budget, slots and blocks last; the
        features may hold one back in its place or fail it."""
        chunked = self.scheduler_config.enable_chunked_prefill
        kv = self.kv_cache_manager
        source = self.kv_source
        skipped: list[Request] = []  # held back this step: stay queued, in order
        while self.waiting and not plan.full() and len(self.running) < self.max_num_running_reqs:
            request = self.waiting.peek_request()
            verdict = WAIT if request.request_id in in_flight else self._admission(request)
            if verdict == WAIT:  # in flight (preempted while its step is unprocessed), or a feature holds it
                skipped.append(self.waiting.pop_request())
                continue
            if verdict is not None:
                self.waiting.pop_request()
                self._fail_request(request, verdict)
                continue
            num_ext, load_async = 0, False
            if kv.get_blocks(request.request_id):
                hit_blocks, num_hit = [], request.num_computed_tokens  # loaded by a connector
            else:
                hit_blocks, num_hit = kv.get_computed_blocks(request)
                num_ext, load_async = source.external_tokens(request, num_hit)
                if num_ext is None:  # the source does not know yet: ask next step
                    skipped.append(self.waiting.pop_request())
                    continue
            if num_ext and load_async:
                if kv.allocate_slots(request, num_ext, hit_blocks, num_hit, delay_cache=True) is None:
                    break
                self.waiting.pop_request()
                request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                source.start_async_load(request, num_hit, num_ext)
                skipped.append(request)
                continue
            # a synchronous load fills its blocks in this very step; the prompt's last token is
            # always computed (its logits)
            num_loaded = min(num_ext, request.num_tokens - 1 - num_hit)
            num_new = request.num_tokens - num_hit - num_loaded
            if chunked:
                if threshold > 0:
                    num_new = min(num_new, threshold)
                num_new = min(num_new, plan.token_budget)
            elif num_new > plan.token_budget:
                break
            ahead = 0 if num_ext else min(self.kv_lookahead, self.max_model_len - num_hit - num_new)  # as for running ones
            num_hit_tokens = num_hit if hit_blocks else 0  # the local prefix hit (not a connector's load)
            new_blocks = kv.allocate_slots(request, num_new + ahead, hit_blocks, num_hit_tokens) if ahead > 0 else None
            if new_blocks is None:
                new_blocks = kv.allocate_slots(request, num_loaded + num_new, hit_blocks, num_hit_tokens, delay_cache=num_ext > 0)
            if new_blocks is None:
                if not self.running and source.num_held_blocks() == 0:
                    # every block is free and it still does not fit: it never will
                    self.waiting.pop_request()
                    self._cap_for_kv_exhaustion(request)
                    continue
                break
            self.waiting.pop_request()
            if num_ext:
                source.sync_load(request, num_hit, num_ext)
                num_hit += num_loaded
            self._start_running(request, num_hit)
            plan.take(request, num_new, running=False)
        for request in reversed(skipped):
            self.waiting.prepend_request(request)

    def _admission(self, request: Request) -> str | None:
        """The features' word on a waiting request: ``None`` (go on), :data:`WAIT`, or an error."""
        for feature in self._admitters:
            verdict = feature.admit(request)
            if verdict is not None:
                return verdict
        return None

    def _drafts(self, request: Request, budget: int) -> list[int]:
        """The tokens a feature adds to a running decode this step (drafts to verify)."""
        for feature in self._contributors:
            drafts = feature.contribute(request, budget, len(self.running))
            if drafts:
                return drafts
        return []

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
        for feature in self.features:
            feature.take_result(scheduler_output, model_runner_output)
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
            whole = self._feature_output(request, i, model_runner_output)
            if whole is not None:  # a feature produced the request's output and finished it (pooling)
                outputs.append(whole)
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
                if check_stop(request, self.max_model_len):
                    break
            error = None
            for feature in self._token_takers:  # drafts rolled back, grammars fed
                error = feature.take_tokens(request, new_token_ids, len(sampled), i, scheduler_output, model_runner_output) or error
            if error is not None:
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
        for feature in self.features:
            feature.step_done(scheduler_output)
        return EngineCoreOutputs(outputs=outputs, scheduler_stats=self.make_stats())

    def _feature_output(self, request: Request, index: int, runner_output: ModelRunnerOutput) -> EngineCoreOutput | None:
        for feature in self._output_takers:
            output = feature.take_output(request, index, runner_output)
            if output is not None:
                output.events = self._events.pop(request.request_id, None)
                return output
        return None

    # -- stats --------------------------------------------------------------------------------
    def make_stats(self) -> SchedulerStats:
        pc = self.kv_cache_manager.prefix_cache_stats
        stats = SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting),
            kv_cache_usage=self.kv_cache_manager.usage,
            prefix_cache_queries=pc.queries,
            prefix_cache_hits=pc.hits,
            prefix_cache_hit_rate=pc.hit_rate,
            num_preemptions=self.num_preemptions,
            num_prompt_tokens_computed=self.num_prompt_tokens_computed,
        )
        for feature in self.features:
            feature.stats(stats, self.running, self.waiting)
        return stats

