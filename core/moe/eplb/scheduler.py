"""The load balancer's seam in the engine core (``--enable-eplb``): the workers report its state
with each step's output (``ModelRunnerOutput.eplb_stats``, from rank 0); this feature keeps the
latest and puts it in the scheduler stats, which ``/metrics`` shows as
``vllm:eplb_balancedness`` and the rearrangement counters."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from host.contracts.messages import EPLBStats
from host.core.scheduler.feature import SchedulerFeature

if TYPE_CHECKING:
    from host.contracts.messages import SchedulerStats
    from host.contracts.request import Request
    from host.contracts.runner_output import ModelRunnerOutput
    from host.contracts.scheduler_output import SchedulerOutput


class EPLBFeature(SchedulerFeature):
    name = "eplb"

    def __init__(self) -> None:
        self.latest = EPLBStats()

    def take_result(self, scheduler_output: "SchedulerOutput", runner_output: "ModelRunnerOutput") -> None:
        report = getattr(runner_output, "eplb_stats", None)
        if report:
            self.latest = EPLBStats(**report)

    def stats(self, stats: "SchedulerStats", running: list["Request"], waiting: Iterable["Request"]) -> None:
        stats.eplb_stats = self.latest
