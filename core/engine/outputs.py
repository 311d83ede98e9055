"""The data that flows between scheduler, executor and model runner each step."""

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


@dataclass
class CachedRequestData:
    """Requests already in the runner's persistent batch: only what changed this step."""

    req_ids: list[str] = field(default_factory=list)
    new_block_ids: list[list[int]] = field(default_factory=list)  # appended to the block table
    num_computed_tokens: list[int] = field(default_factory=list)


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

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0


@dataclass
class TokenLogprobs:
    """Logprobs at one position: ``token_ids[0]`` is the token that was sampled (or, for a
    prompt position, the prompt's token), ``token_ids[1:]`` the top-k tokens, best first;
    ``rank`` is the rank of ``token_ids[0]`` (1 = the most likely token)."""

    token_ids: list[int]
    logprobs: list[float]
    rank: int


@dataclass
class ModelRunnerOutput:
    """What one step produced: for each scheduled request, its sampled token ids (empty for a
    request whose prefill chunk did not reach the end of the prompt), the logprobs of those
    tokens for requests that asked, and the prompt logprobs computed by this step's prefill
    chunk (positions ``1..``; position 0 has none)."""

    req_ids: list[str]
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]]
    logprobs: list[list[TokenLogprobs] | None] | None = None  # per row, like sampled_token_ids
    prompt_logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)

    def get_output(self) -> "ModelRunnerOutput":
        """A finished output is its own step handle (see ``Executor.execute_model``)."""
        return self


@dataclass
class EngineCoreOutput:
    """New tokens of one request after a step, plus its finish reason once it is done."""

    req_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length", "abort"
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    new_logprobs: list[TokenLogprobs] | None = None  # one per new token, when requested
    new_prompt_logprobs: list[TokenLogprobs] | None = None  # prompt positions done this step
    error: str | None = None  # why the engine failed the request (finish_reason "abort")

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class EngineCoreOutputs:
    outputs: list[EngineCoreOutput] = field(default_factory=list)
    scheduler_stats: Any = None
