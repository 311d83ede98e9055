"""The messages between the front end and the engine core: one type per message.

Every type here is a ``msgspec.Struct``, used as it is both in-process (the offline ``LLM``
drives an :class:`~host.core.engine.core.EngineCore` directly) and on the wire (msgpack over
ZMQ between the API server and the engine-core process). Nothing is converted on the way: the
engine core produces :class:`EngineCoreOutputs` and the front end reads the same type back.

Front end -> engine (one PUSH socket): :class:`EngineCoreRequest` to add a request,
:class:`AbortRequests`, :class:`UtilityCall` (a named engine method, e.g. the plugin listing of
that process) and :class:`Shutdown`. Engine -> front end (one PUSH socket):
:class:`EngineCoreOutputs`, each optionally carrying a :class:`UtilityResult`. The tagged
front-end messages share one decoder.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from host.contracts.lora_request import LoRARequest
from host.contracts.sampling_params import SamplingParams


class EngineCoreRequest(msgspec.Struct, tag="add", omit_defaults=True):
    """One engine request: a prompt's token ids and one sample's :class:`SamplingParams`.

    ``sampling_params`` travels as the dataclass's fields and is rebuilt (so re-validated) on
    decode; in-process it is the object itself. The front end's input processor builds these,
    and its output processor fans a prompt with ``n > 1`` out into ``n`` of them."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: Any
    eos_token_id: int | None = None
    arrival_time: float = 0.0
    priority: int = 0
    cache_salt: str | None = None
    # the client's "kv_transfer_params" (a PD proxy's hand-off from the prefill instance), read
    # by the engine's KV connector; None without one
    kv_transfer_params: dict[str, Any] | None = None
    # the LoRA adapter (--enable-lora), its digest filled by the input processor; None: base model
    lora_request: LoRARequest | None = None
    # a pooling request's PoolingParams (docs/pooling.md): its prompt is pooled, nothing sampled
    pooling_params: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.sampling_params, dict):
            self.sampling_params = SamplingParams(**self.sampling_params)
        if isinstance(self.pooling_params, dict):
            from host.contracts.pooling_params import PoolingParams

            self.pooling_params = PoolingParams(**self.pooling_params)


class AbortRequests(msgspec.Struct, tag="abort"):
    """Finish these engine requests now and free their blocks (a disconnected client, or a stop
    string the front end found). Unknown or finished ids are ignored."""

    request_ids: list[str]


class UtilityCall(msgspec.Struct, tag="utility"):
    """Call ``EngineCore.utility_<method>(*args)``; the answer comes back as a
    :class:`UtilityResult` with the same ``call_id``."""

    call_id: int
    method: str
    args: list[Any] = []


class Shutdown(msgspec.Struct, tag="shutdown"):
    """Stop the engine-core loop; the process then releases the device and exits."""


ToEngine = Union[EngineCoreRequest, AbortRequests, UtilityCall, Shutdown]


class TokenLogprobs(msgspec.Struct, array_like=True):
    """Logprobs at one position: ``token_ids[0]`` is the token that was sampled (or, for a
    prompt position, the prompt's token), ``token_ids[1:]`` the top-k tokens, best first;
    ``rank`` is the rank of ``token_ids[0]`` (1 = the most likely token)."""

    token_ids: list[int]
    logprobs: list[float]
    rank: int


class EngineCoreEvent(msgspec.Struct, array_like=True):
    """A moment in one engine request's life, for the latency metrics: ``type`` is
    :data:`EVENT_QUEUED`, :data:`EVENT_SCHEDULED` (left the waiting queue, again after each
    preemption) or :data:`EVENT_PREEMPTED`; ``timestamp`` is the engine's ``time.monotonic()``
    (one clock for every process of the host, so the front end compares it with its own)."""

    type: int
    timestamp: float


EVENT_QUEUED, EVENT_SCHEDULED, EVENT_PREEMPTED = 1, 2, 3


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    """New tokens of one engine request after a step, plus its finish reason once it is done.

    ``error`` says why the engine failed the request (then ``finish_reason`` is ``"abort"``).
    Logprobs are one :class:`TokenLogprobs` per new token, when the request asked for them;
    prompt logprobs cover the prompt positions this step's prefill chunk computed."""

    req_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length", "abort"
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    new_logprobs: list[TokenLogprobs] | None = None
    new_prompt_logprobs: list[TokenLogprobs] | None = None
    error: str | None = None
    # what happened to the request since its previous output (queued, scheduled, preempted)
    events: list[EngineCoreEvent] | None = None
    # on the last output: what the KV connector hands on (a producer's remote block ids, its
    # host and port), returned to the client as the response's "kv_transfer_params"
    kv_transfer_params: dict[str, Any] | None = None
    # a pooling request's vector (float32 values), on its one and final output
    pooling_output: list[float] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class SpecDecodingStats(msgspec.Struct, omit_defaults=True):
    """Speculative decoding's totals since start-up (vLLM's names)."""

    num_drafts: int = 0  # request-steps that verified at least one draft
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = msgspec.field(default_factory=list)  # by draft position

    def observe(self, num_draft_tokens: int, num_accepted: int) -> None:
        """One request-step verified ``num_draft_tokens`` drafts and accepted the first ``num_accepted``."""
        if num_draft_tokens <= 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        per_pos = self.num_accepted_tokens_per_pos
        if len(per_pos) < num_draft_tokens:
            per_pos.extend([0] * (num_draft_tokens - len(per_pos)))
        for i in range(num_accepted):
            per_pos[i] += 1


class LoRAStats(msgspec.Struct):
    """The adapters in use (vLLM's ``lora_requests_info``): ``max_lora`` and, per adapter name,
    how many running and waiting requests use it."""

    max_lora: int
    running: dict[str, int] = msgspec.field(default_factory=dict)
    waiting: dict[str, int] = msgspec.field(default_factory=dict)


class EPLBStats(msgspec.Struct):
    """The expert-parallel load balancer (``--enable-eplb``): balancedness of the last load window
    (mean over max of the per-rank expert load, 1.0 even; ``None`` before the first window ends),
    rearrangements done and skipped (gain below ``min_improvement``) since start-up."""

    balancedness: float | None = None
    rearrangements: int = 0
    skipped: int = 0


class SchedulerStats(msgspec.Struct, omit_defaults=True):
    """A snapshot of the scheduler for metrics (counters are totals since start-up)."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0  # tokens looked up
    prefix_cache_hits: int = 0  # tokens found
    prefix_cache_hit_rate: float = 0.0
    num_preemptions: int = 0
    # waiting requests held back by something other than capacity (a grammar still compiling);
    # the rest of num_waiting_reqs waits for capacity
    num_waiting_deferred: int = 0
    # prompt tokens the model computed (neither a local prefix hit nor loaded by a KV connector)
    num_prompt_tokens_computed: int = 0
    # the KV connector's counters (external_hit_tokens, load_bytes, save_bytes,
    # failed_transfers, failed_loads, ...), totals since start-up; None without a connector
    kv_connector_stats: dict[str, int] | None = None
    # --speculative-config: totals since start-up (core/spec_decode/scheduler.py); else None
    spec_decoding: SpecDecodingStats | None = None
    # --enable-lora: the adapters in use (core/lora/scheduler.py); else None
    lora_stats: LoRAStats | None = None
    # --enable-eplb: the load balancer's state (core/moe/eplb/scheduler.py); else None
    eplb_stats: EPLBStats | None = None


class UtilityResult(msgspec.Struct):
    """The answer to one :class:`UtilityCall`: its result, or the error it raised."""

    call_id: int
    result: Any = None
    error: str | None = None


class EngineCoreOutputs(msgspec.Struct, omit_defaults=True):
    """What one engine step (or one utility call) sends to the front end."""

    outputs: list[EngineCoreOutput] = []
    scheduler_stats: SchedulerStats | None = None
    utility: UtilityResult | None = None
    timestamp: float = 0.0
    # an idle engine's "still here" (about once a second, nothing else set): the client records
    # when it last heard from the engine (/health's heartbeat check) and drops it
    heartbeat: bool = False
    # which data-parallel engine sent this (its parallel.data_parallel_rank; -dp, the /metrics
    # "engine" label)
    engine_index: int = 0
    # the engine's last message before it exits (a worker process died, a step raised): every
    # request it held fails with this reason, as an engine failure (HTTP 503), not a bad request
    fatal_error: str | None = None


def _enc_hook(obj: Any) -> Any:
    raise NotImplementedError(f"cannot encode {type(obj).__name__}: engine messages carry only msgspec types")


encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
to_engine_decoder = msgspec.msgpack.Decoder(ToEngine)
from_engine_decoder = msgspec.msgpack.Decoder(EngineCoreOutputs)

__all__ = [
    "AbortRequests",
    "EVENT_PREEMPTED",
    "EVENT_QUEUED",
    "EVENT_SCHEDULED",
    "EngineCoreEvent",
    "EngineCoreOutput",
    "EngineCoreOutputs",
    "EngineCoreRequest",
    "SchedulerStats",
    "Shutdown",
    "TokenLogprobs",
    "UtilityCall",
    "UtilityResult",
    "encoder",
    "from_engine_decoder",
    "to_engine_decoder",
]
