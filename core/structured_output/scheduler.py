"""Structured outputs' seam into the scheduler: a constrained request waits, in its place, until
its grammar has compiled (a compile error fails it); every token it gets is fed to its grammar
matcher, and a token the grammar refuses fails it. Waiting requests still compiling are the
stats' ``num_waiting_deferred``."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Iterable

from host.contracts.request import RequestStatus
from host.core.scheduler.feature import WAIT, SchedulerFeature
from host.core.structured_output.engine import StructuredOutputManager

if TYPE_CHECKING:
    from host.contracts.messages import SchedulerStats
    from host.contracts.request import Request
    from host.contracts.runner_output import ModelRunnerOutput
    from host.contracts.scheduler_output import SchedulerOutput

logger = logging.getLogger("host.structured_output")


class StructuredOutputFeature(SchedulerFeature):
    name = "structured_output"

    def added(self, request: "Request") -> None:
        if request.structured_output is not None:  # waits until its grammar has compiled
            request.status = RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR

    def admit(self, request: "Request") -> str | None:
        if request.status != RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR:
            return None
        if not request.structured_output.ready():
            return WAIT
        if request.structured_output.error is not None:
            return request.structured_output.error
        request.status = RequestStatus.WAITING
        return None

    def take_tokens(self, request: "Request", new_token_ids: list[int], num_sampled: int, index: int,
                    scheduler_output: "SchedulerOutput", runner_output: "ModelRunnerOutput") -> str | None:
        if request.structured_output is None or StructuredOutputManager.accept_tokens(request, new_token_ids):
            return None
        error = f"token {new_token_ids[-1]} broke the request's structured_outputs grammar"
        logger.error("request %s: %s", request.request_id, error)
        return error

    def stats(self, stats: "SchedulerStats", running: list["Request"], waiting: Iterable["Request"]) -> None:
        stats.num_waiting_deferred = sum(
            1 for r in waiting
            if r.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR and not r.structured_output.ready()
        )
