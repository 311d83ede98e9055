"""The batch queue: up to N launched steps in flight, so every pipeline stage has work.

With ``-pp N`` a step crosses N stages one after the other; one step at a time would leave
N - 1 stages idle. The engine core therefore launches a new step while earlier ones are still
in the pipeline (the executor's ``max_concurrent_batches`` of them) and processes their
outputs in launch order. A request is in at most one launched step: the scheduler skips the
requests of unprocessed steps (``Scheduler.schedule(in_flight=...)``), since their next input
token is still being sampled by the last stage. The pipeline therefore fills with *different*
requests, and sampling that reads a request's history (penalties, seeds, grammars) always sees
all of it. So that one step does not take every request and leave the next ones empty, each
step gets an even share of the requests not in flight over the free places in the queue
(``max_num_reqs``): with ``-pp 2`` and 8 decoding requests, two steps of 4 alternate.

The queue drives its engine core through public members only (:class:`QueuedEngine`); the core
imports this module, never the other way round.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

from host.contracts.messages import EngineCoreOutputs
from host.contracts.runner_output import ModelRunnerOutput
from host.contracts.scheduler_output import SchedulerOutput


class QueuedEngine(Protocol):
    """What the batch queue uses of its engine core (``host.core.engine.core.EngineCore``)."""

    scheduler: Any  # its Scheduler: schedule(in_flight=..., max_num_reqs=...), waiting, running, make_stats()
    executor: Any  # its executor: execute_model(so, non_blocking=True) -> a step handle

    def attach_grammar_bitmask(self, scheduler_output: SchedulerOutput) -> None:
        """Add the structured-output bitmask rows to a step about to launch."""
        ...

    def idle_step(self, scheduler_output: SchedulerOutput) -> EngineCoreOutputs:
        """A step that computes nothing (finished / preempted requests dropped, ended ones reported)."""
        ...

    def update_from_output(self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput) -> EngineCoreOutputs:
        """The scheduler's update from one step's output."""
        ...


class BatchQueue:
    """The launched, unprocessed steps of one engine core, oldest first (at most ``depth``)."""

    def __init__(self, core: QueuedEngine, depth: int) -> None:
        if depth < 1:
            raise ValueError(f"batch queue depth={depth} must be >= 1 (the executor's max_concurrent_batches)")
        self.core = core
        self.depth = depth
        self._steps: deque[tuple[SchedulerOutput, Any]] = deque()
        self._in_flight: set[str] = set()  # the requests of the queued steps

    def __len__(self) -> int:
        return len(self._steps)

    @property
    def in_flight(self) -> frozenset[str]:
        return frozenset(self._in_flight)

    def _share(self) -> int:
        """This step's share of the requests that could run: the ones not in flight, spread
        over the free places in the queue (at least one)."""
        scheduler = self.core.scheduler
        ready = len(scheduler.waiting) + sum(1 for r in scheduler.running if r.request_id not in self._in_flight)
        free = self.depth - len(self._steps)
        return max(1, -(-ready // free))

    def step(self) -> EngineCoreOutputs:
        """Launch a new step if there is room and something to run; return the outputs of the
        oldest step once the queue is full or nothing new can run (empty outputs otherwise)."""
        core, scheduler = self.core, self.core.scheduler
        if len(self._steps) < self.depth:
            so = scheduler.schedule(in_flight=self._in_flight, max_num_reqs=self._share())
            if (so.total_num_scheduled_tokens > 0 or so.finished_req_ids or so.preempted_req_ids
                    or so.kv_connector_metadata is not None):
                # a step that only drops finished / preempted requests (or carries a KV
                # connector's plan) still goes through the pipeline: every stage must see it in order
                core.attach_grammar_bitmask(so)
                self._steps.append((so, core.executor.execute_model(so, non_blocking=True)))
                self._in_flight.update(so.num_scheduled_tokens)
                if so.total_num_scheduled_tokens > 0 and len(self._steps) < self.depth:
                    return EngineCoreOutputs(outputs=[], scheduler_stats=scheduler.make_stats())
            elif not self._steps:
                return core.idle_step(so)
        so, handle = self._steps.popleft()
        self._in_flight.difference_update(so.num_scheduled_tokens)
        return core.update_from_output(so, handle.get_output())
