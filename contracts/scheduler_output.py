"""The scheduler's plan for one step, as the executor hands it to the model runner."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class NewRequestData:
    """A request the model runner has not seen yet (first schedule, or resumed after preemption:
    preemption drops the runner's state, so a resumed request is sent again as new)."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: Any
    block_ids: list[int]
    num_computed_tokens: int
    # output tokens generated so far (non-empty for a request resumed after preemption)
    output_token_ids: list[int] = field(default_factory=list)
    eos_token_id: int | None = None
    lora_request: Any = None  # its LoRARequest (--enable-lora), None for the base model
    pooling_params: Any = None  # its PoolingParams on a pooling model (docs/pooling.md), else None
    # a hybrid KV cache (several KV cache groups): the block ids of groups 1.. (``block_ids`` is
    # group 0's); empty with one group
    group_block_ids: list[list[int]] = field(default_factory=list)


@dataclass
class CachedRequestData:
    """Requests already in the runner's persistent batch: only what changed this step."""

    req_ids: list[str] = field(default_factory=list)
    new_block_ids: list[list[int]] = field(default_factory=list)  # appended to the block table
    # a hybrid KV cache: per request, the new block ids of groups 1.. (``new_block_ids`` is group
    # 0's); empty with one group
    new_group_block_ids: list[list[list[int]]] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)
    # pipeline parallelism only (Scheduler(send_token_ids=True)): each request's input tokens
    # this step, so stages that do not sample learn the tokens the last stage sampled
    new_token_ids: list[list[int]] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    """One step's plan: which requests run, how many new tokens each, which blocks they own."""

    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    finished_req_ids: set[str] = field(default_factory=set)  # drop from the persistent batch
    preempted_req_ids: set[str] = field(default_factory=set)
    # structured outputs: one int32 bitmask row (ceil(vocab/32) words) per request id listed,
    # for the requests that sample a token this step
    structured_output_request_ids: list[str] = field(default_factory=list)
    grammar_bitmask: Any = None
    # requests whose step ends at their last known token, so its sample is their next token
    # (the rest run a prefill chunk short of the prompt's end)
    sampling_req_ids: set[str] = field(default_factory=set)
    # with a KV connector: the step's number (fences deferred frees) and the connector's plan
    # for the workers (its scheduler role's build_connector_meta)
    step_seq: int = 0
    kv_connector_metadata: Any = None
    # --speculative-config: the drafts each request verifies this step (its scheduled tokens are
    # its last known token plus these), only requests with drafts listed
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0
