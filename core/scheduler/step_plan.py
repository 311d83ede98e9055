"""One step's plan while the scheduler builds it, and the :class:`SchedulerOutput` it becomes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from host.contracts.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput

if TYPE_CHECKING:
    from host.contracts.request import Request
    from host.core.kv_cache.block_pool import KVCacheBlock
    from host.core.kv_cache.manager import KVCacheManager


@dataclass
class StepPlan:
    """What one ``schedule()`` call has decided so far: the token budget left, the tokens and new
    blocks of each scheduled request, the requests preempted, the drafts each decode verifies."""

    token_budget: int
    req_limit: int
    num_scheduled: dict[str, int] = field(default_factory=dict)
    new_blocks_of: dict[str, list["KVCacheBlock"]] = field(default_factory=dict)
    scheduled_running: list["Request"] = field(default_factory=list)
    scheduled_new: list["Request"] = field(default_factory=list)
    preempted: list["Request"] = field(default_factory=list)
    spec_tokens: dict[str, list[int]] = field(default_factory=dict)

    def full(self) -> bool:
        return self.token_budget <= 0 or len(self.num_scheduled) >= self.req_limit

    def take(self, request: "Request", num_new: int, running: bool, new_blocks: list["KVCacheBlock"] | None = None) -> None:
        """``request`` computes ``num_new`` tokens this step."""
        req_id = request.request_id
        (self.scheduled_running if running else self.scheduled_new).append(request)
        if running:
            self.new_blocks_of[req_id] = new_blocks or []
        self.num_scheduled[req_id] = num_new
        self.token_budget -= num_new

    def give_back(self, request: "Request") -> None:
        """A running request scheduled earlier in this step was preempted: its tokens return to the budget."""
        req_id = request.request_id
        if req_id in self.num_scheduled:
            self.token_budget += self.num_scheduled.pop(req_id)
            self.spec_tokens.pop(req_id, None)
            self.new_blocks_of.pop(req_id, None)
            self.scheduled_running.remove(request)

    def output(self, kv: "KVCacheManager", finished_req_ids: set[str], send_token_ids: bool) -> SchedulerOutput:
        """The plan as the workers get it. With ``send_token_ids`` (pipeline parallelism) each
        running request's input tokens go too: stages that do not sample never saw them."""
        grouped = getattr(kv, "grouped", False)  # the hybrid manager: new blocks per group (GroupedBlocks)
        hybrid = kv.num_groups > 1
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
                group_block_ids=kv.get_group_block_ids(r.request_id)[1:] if hybrid else [],
            )
            for r in self.scheduled_new
        ]
        running = self.scheduled_running
        if grouped:  # new_blocks_of holds GroupedBlocks (one list per group)
            ids = [self.new_blocks_of[r.request_id].block_ids() if self.new_blocks_of[r.request_id] else None for r in running]
            empty = [[] for _ in range(kv.num_groups - 1)]
            cached = CachedRequestData(
                req_ids=[r.request_id for r in running],
                new_block_ids=[g[0] if g else [] for g in ids],
                num_computed_tokens=[r.num_computed_tokens for r in running],
                new_group_block_ids=[g[1:] if g else empty for g in ids] if hybrid else [],
            )
        else:
            cached = CachedRequestData(
                req_ids=[r.request_id for r in running],
                new_block_ids=[[b.block_id for b in self.new_blocks_of[r.request_id]] for r in running],
                num_computed_tokens=[r.num_computed_tokens for r in running],
            )
        if send_token_ids:
            cached.new_token_ids = [
                r.all_token_ids[r.num_computed_tokens : r.num_computed_tokens + self.num_scheduled[r.request_id]]
                for r in running
            ]
        return SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=self.num_scheduled,
            total_num_scheduled_tokens=sum(self.num_scheduled.values()),
            finished_req_ids=finished_req_ids,
            preempted_req_ids={r.request_id for r in self.preempted},
            scheduled_spec_decode_tokens=self.spec_tokens,
        )
