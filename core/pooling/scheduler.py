"""A pooling request's end in the engine core: its prompt ran in one step, its vector is back.

The pooling runner (:mod:`host.core.pooling.worker`) pools every pooling request it
ran; :func:`finish_pooled` turns that into the request's one and final
:class:`EngineCoreOutput` (``pooling_output``, finish reason ``"stop"``). The scheduler then
frees its blocks in the same step: no KV is kept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from host.contracts.messages import EngineCoreOutput
from host.contracts.request import Request, RequestStatus
from host.core.scheduler.feature import SchedulerFeature

if TYPE_CHECKING:
    from host.contracts.runner_output import ModelRunnerOutput


def finish_pooled(request: Request, pooler_output: dict[str, list[float]] | None, events: Any = None) -> EngineCoreOutput:
    """Mark ``request`` finished and build its output from the step's ``pooler_output``; a
    vector missing from it (the runner is not a pooling runner) fails the request with an error
    naming the fix instead of losing it."""
    vector = (pooler_output or {}).get(request.request_id)
    if vector is None:
        request.status = RequestStatus.FINISHED_ABORTED
        return EngineCoreOutput(
            req_id=request.request_id, new_token_ids=[], finish_reason="abort", events=events,
            error="the model runner returned no pooled vector; pooling requests need a pooling model (--runner pooling)",
        )
    request.status = RequestStatus.FINISHED_STOPPED
    return EngineCoreOutput(
        req_id=request.request_id, new_token_ids=[], finish_reason="stop", events=events, pooling_output=vector
    )


class PoolingFeature(SchedulerFeature):
    """The seam: a pooling request's step result is its whole output (:func:`finish_pooled`)."""

    name = "pooling"

    def take_output(self, request: Request, index: int, runner_output: "ModelRunnerOutput") -> EngineCoreOutput | None:
        if request.pooling_params is None:
            return None
        return finish_pooled(request, runner_output.pooler_output)
