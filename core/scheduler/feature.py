"""A feature's one seam into the scheduler.

A feature that changes which requests run, what a step computes or what a step's result means
(speculative decoding, LoRA, KV transfer, pooling, structured outputs; later expert load
balancing, encoder budgets) gives the scheduler one :class:`SchedulerFeature`. The
scheduler keeps a list of them and calls every one at the same points of each step; it never
asks which features are on. Every method has a default that does nothing, so a feature
implements only the points it needs:

1. **admit a request** — :meth:`added` when it is queued, :meth:`begin_admissions`, then
   :meth:`admit` for each waiting request the step considers (go on, wait in place, or fail
   it) and :meth:`admitted` for each that joins the running ones;
2. **contribute to the step** — :meth:`contribute` adds tokens to a running decode (drafts to
   verify), :attr:`kv_lookahead` reserves KV slots past a step's tokens, and :meth:`plan`
   sees the finished plan (connector metadata);
3. **take the step's result** — :meth:`take_result` sees the runner's output first,
   :meth:`take_output` may produce a request's whole output itself (a pooled vector),
   :meth:`take_tokens` sees each request's new tokens (and may fail it), :meth:`step_done`
   closes the step; :meth:`finished` hears of every request that leaves;
4. **typed stats** — :meth:`stats` fills the feature's field of :class:`SchedulerStats`.

A feature acts on requests only through the scheduler's public methods
(:meth:`~host.core.scheduler.request_book.RequestBook.requeue`,
:meth:`~host.core.scheduler.request_book.RequestBook.fail_running`), given to it by :meth:`bind`.

Where a waiting request's KV comes from beyond the local prefix cache, and who frees a
request's blocks, is a second, smaller seam: :class:`~host.core.scheduler.kv_source.KVSource`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Iterable

if TYPE_CHECKING:
    from host.contracts.messages import EngineCoreOutput, SchedulerStats
    from host.contracts.request import Request, RequestStatus
    from host.contracts.runner_output import ModelRunnerOutput
    from host.contracts.scheduler_output import SchedulerOutput

WAIT = "wait"
""":meth:`SchedulerFeature.admit`'s answer for a request that stays queued, in its place, this step."""


class SchedulerFeature:
    """One feature's part in every step (see the module docstring for when each method runs)."""

    name: ClassVar[str] = "feature"
    kv_lookahead: int = 0
    """KV slots reserved past each step's tokens when free (a model drafter writes its drafts' KV there)."""

    def bind(self, scheduler: Any) -> None:
        """Called once by the scheduler that runs this feature."""
        self.scheduler = scheduler

    # -- 1. admit a request ----------------------------------------------------------------------
    def added(self, request: "Request") -> None:
        """A new request was queued (status ``WAITING``; a feature may hold it in a waiting status of its own)."""

    def begin_admissions(self, running: list["Request"]) -> None:
        """The step starts admitting waiting requests; ``running`` are the requests running now."""

    def admit(self, request: "Request") -> str | None:
        """A waiting request the step considers: ``None`` lets it go on, :data:`WAIT` keeps it
        queued in its place this step, any other string fails it with that error."""
        return None

    def admitted(self, request: "Request") -> None:
        """``request`` joined the running ones this step."""

    # -- 2. contribute to the step ---------------------------------------------------------------
    def contribute(self, request: "Request", budget: int, num_running: int) -> list[int]:
        """Extra tokens a running decode computes this step after its own one (drafts to verify),
        within ``budget`` tokens."""
        return []

    def plan(self, output: "SchedulerOutput") -> None:
        """The step's plan is complete (before it goes to the workers)."""

    # -- 3. take the step's result ---------------------------------------------------------------
    def take_result(self, scheduler_output: "SchedulerOutput", runner_output: "ModelRunnerOutput") -> None:
        """The runner's output of a step, before any request's tokens are appended."""

    def take_output(self, request: "Request", index: int, runner_output: "ModelRunnerOutput") -> "EngineCoreOutput | None":
        """A request's whole output for this step, produced by the feature (which then finished
        it); ``None`` lets the scheduler append its sampled tokens."""
        return None

    def take_tokens(self, request: "Request", new_token_ids: list[int], num_sampled: int, index: int,
                    scheduler_output: "SchedulerOutput", runner_output: "ModelRunnerOutput") -> str | None:
        """``new_token_ids`` were appended to ``request`` (stop conditions applied; ``num_sampled``
        tokens came back). A string fails the request with that error."""
        return None

    def step_done(self, scheduler_output: "SchedulerOutput") -> None:
        """The step's result is fully processed."""

    def finished(self, request: "Request", was: "RequestStatus") -> None:
        """``request`` left the scheduler (finished, aborted or failed); ``was`` is its status before."""

    # -- 4. typed stats --------------------------------------------------------------------------
    def stats(self, stats: "SchedulerStats", running: list["Request"], waiting: Iterable["Request"]) -> None:
        """Fill this feature's field of ``stats``."""


def overriding(features: Iterable[SchedulerFeature], method: str) -> list[SchedulerFeature]:
    """The features that implement ``method`` (the scheduler calls only those on its hot paths)."""
    default = getattr(SchedulerFeature, method)
    return [f for f in features if getattr(type(f), method) is not default]
