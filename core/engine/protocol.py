"""What the API server and the engine-core process say to each other over ZMQ (msgpack via
msgspec).

Front end -> engine (one PUSH socket): ``EngineCoreRequest`` to add a request, ``AbortRequests``,
``UtilityCall`` (a named engine method, for example the plugin listing of that process).
Engine -> front end (one PUSH socket): ``EngineCoreOutputs`` batches, each optionally carrying a
``UtilityResult``. Every message is a tagged msgspec ``Struct`` so one decoder reads them all.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from host.core.engine.outputs import EngineCoreOutput, TokenLogprobs
from host.core.sampling_params import SamplingParams, StructuredOutputsParams


class EngineCoreRequest(msgspec.Struct, tag="add", omit_defaults=True):
    """``sampling_params`` travels as the fields of :class:`SamplingParams` (built with
    :func:`params_dict`); the engine rebuilds and so re-validates it."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: dict[str, Any]
    eos_token_id: int | None = None
    arrival_time: float = 0.0
    priority: int = 0
    cache_salt: str | None = None


class AbortRequests(msgspec.Struct, tag="abort"):
    request_ids: list[str]


class UtilityCall(msgspec.Struct, tag="utility"):
    call_id: int
    method: str
    args: list[Any] = []


class Shutdown(msgspec.Struct, tag="shutdown"):
    pass


ToEngine = Union[EngineCoreRequest, AbortRequests, UtilityCall, Shutdown]


class UtilityResult(msgspec.Struct):
    call_id: int
    result: Any = None
    error: str | None = None


class SchedulerStatsMsg(msgspec.Struct, omit_defaults=True):
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0


class OutputMsg(msgspec.Struct, omit_defaults=True, array_like=True):
    req_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    new_logprobs: list[TokenLogprobs] | None = None
    new_prompt_logprobs: list[TokenLogprobs] | None = None
    error: str | None = None


class EngineCoreOutputsMsg(msgspec.Struct, omit_defaults=True):
    outputs: list[OutputMsg] = []
    stats: SchedulerStatsMsg | None = None
    utility: UtilityResult | None = None
    timestamp: float = 0.0


def params_dict(params: SamplingParams) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(params)


def params_from_dict(fields: dict[str, Any]) -> SamplingParams:
    return SamplingParams(**fields)


def to_msg(out: EngineCoreOutput) -> OutputMsg:
    return OutputMsg(
        out.req_id, out.new_token_ids, out.finish_reason, out.stop_reason, out.num_cached_tokens,
        out.new_logprobs, out.new_prompt_logprobs, out.error,
    )


def from_msg(msg: OutputMsg) -> EngineCoreOutput:
    return EngineCoreOutput(
        req_id=msg.req_id, new_token_ids=msg.new_token_ids, finish_reason=msg.finish_reason,
        stop_reason=msg.stop_reason, num_cached_tokens=msg.num_cached_tokens,
        new_logprobs=msg.new_logprobs, new_prompt_logprobs=msg.new_prompt_logprobs, error=msg.error,
    )


def stats_msg(stats: Any) -> SchedulerStatsMsg | None:
    if stats is None:
        return None
    return SchedulerStatsMsg(
        num_running_reqs=stats.num_running_reqs, num_waiting_reqs=stats.num_waiting_reqs,
        kv_cache_usage=stats.kv_cache_usage, prefix_cache_queries=stats.prefix_cache_queries,
        prefix_cache_hits=stats.prefix_cache_hits, num_preemptions=stats.num_preemptions,
    )


def _enc_hook(obj: Any) -> Any:
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
to_engine_decoder = msgspec.msgpack.Decoder(ToEngine)
from_engine_decoder = msgspec.msgpack.Decoder(EngineCoreOutputsMsg)

__all__ = [
    "AbortRequests",
    "EngineCoreOutputsMsg",
    "EngineCoreRequest",
    "OutputMsg",
    "SchedulerStatsMsg",
    "Shutdown",
    "StructuredOutputsParams",
    "UtilityCall",
    "UtilityResult",
    "encoder",
    "params_dict",
    "params_from_dict",
    "from_engine_decoder",
    "from_msg",
    "stats_msg",
    "to_engine_decoder",
    "to_msg",
]
