"""What the model runner produced in one step, as the executor hands it back to the scheduler."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from host.contracts.messages import TokenLogprobs


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
    # the KV connector's report for this step (host.sdk.KVConnectorOutput), or one per rank
    # (a list) when an executor gathers every worker's; None without a connector
    kv_connector_output: Any = None
    # --speculative-config: each row's drafts for its next step (like sampled_token_ids; [] for
    # none), None without speculation
    spec_token_ids: list[list[int]] | None = None
    # a pooling model: each pooled request's vector by request id (docs/pooling.md), else None
    pooler_output: dict[str, list[float]] | None = None
    # --enable-eplb: the load balancer's report (balancedness, rearrangements, skipped), else None
    eplb_stats: dict[str, Any] | None = None

    def get_output(self) -> "ModelRunnerOutput":
        """A finished output is its own step handle (see ``Executor.execute_model``)."""
        return self


class StepHandle(Protocol):
    """What ``ModelRunner.execute_model`` returns: a finished :class:`ModelRunnerOutput`, or a
    launched step's handle (``host.core.worker.step_handle.PendingStep``) whose
    :meth:`get_output` waits for it."""

    kv_connector_output: Any

    def get_output(self) -> ModelRunnerOutput:
        """The step's output (waiting for the device if it is still running)."""
        ...


@dataclass
class StepTiming:
    """Where one step's time went: the sampler (metadata included) against the whole step."""

    num_reqs: int
    num_tokens: int
    sampler_s: float
    step_s: float
