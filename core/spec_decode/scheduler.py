"""The scheduler's side of speculative decoding (docs/speculative.md): which drafts a running
request gets this step (trimmed to the budget, ``max_model_len`` and ``max_tokens``; none while
its auto-off holds), the rollback of rejected drafts, and the acceptance counts the metrics
report.

The auto-off, per request: every step in which a request verified drafts adds
``accepted / drafted`` to a window of its last ``auto_off_window`` drafted steps. Once the
window is full and its mean is below ``auto_off_threshold``, the request gets no drafts for
``auto_off_probe_steps`` of its decode steps (it decodes one token a step, at the plain path's
cost); then it is probed again: a probe is judged on its first ``max(2, auto_off_window // 4)``
drafted steps. A probe that fails turns drafts off again for twice as long as the last time
(at most 8x ``auto_off_probe_steps``), so a request that never gains pays for few probes; one
that passes goes back to the full window.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from host.contracts.messages import SpecDecodingStats
from host.core.scheduler.feature import SchedulerFeature

if TYPE_CHECKING:
    from host.contracts.messages import SchedulerStats
    from host.contracts.request import Request, RequestStatus
    from host.contracts.runner_output import ModelRunnerOutput
    from host.contracts.scheduler_output import SchedulerOutput
    from host.core.config import EngineConfig, SpeculativeConfig

logger = logging.getLogger("host.spec_decode")


def check_speculative_support(config: "EngineConfig", async_explicit: bool) -> None:
    """Refuse, at start-up, what speculation does not run with; turn off the asynchronous
    scheduling a GPU platform would default to (the drafts of step N+1 need step N's tokens)."""
    if config.parallel.pipeline_parallel_size > 1:
        raise ValueError(
            f"--speculative-config does not run with -pp {config.parallel.pipeline_parallel_size} (pipeline "
            "parallelism); drop one of them"
        )
    if config.scheduler.async_scheduling:
        if async_explicit:
            raise ValueError(
                "--speculative-config does not run with --async-scheduling: the next step's drafts need this "
                "step's tokens; drop --async-scheduling"
            )
        logger.info("speculative decoding: asynchronous scheduling is off (each step's drafts need the last step's tokens)")
        config.scheduler.async_scheduling = False


@dataclass
class _AutoOff:
    window: deque = field(default_factory=deque)
    off_steps_left: int = 0  # the request's decode steps still run without drafts
    strikes: int = 0  # consecutive turn-offs (0: not probing)


class SpecDecodeFeature(SchedulerFeature):
    """The scheduler's speculative-decoding state: per-request auto-off windows and the
    step's acceptance counts. Its seam: drafts contributed to running decodes, KV lookahead
    for a model drafter, the rollback after each step, the acceptance totals."""

    name = "spec_decode"

    def __init__(self, spec: "SpeculativeConfig", max_model_len: int) -> None:
        self.spec = spec
        self.kv_lookahead = spec.kv_lookahead
        self.k = int(spec.num_speculative_tokens)
        self.max_model_len = max_model_len
        self._auto: dict[str, _AutoOff] = {}
        self.counts = SpecDecodingStats()  # the totals since start-up

    def contribute(self, request: "Request", budget: int, num_running: int) -> list[int]:
        """The drafts ``request`` (a running decode) is scheduled with this step: its proposed
        ``spec_token_ids`` cut so that 1 + d tokens fit ``budget``, the sequence stays within
        ``max_model_len`` and no draft lies beyond ``max_tokens``; ``[]`` while its auto-off
        holds or the batch is at ``disable_by_batch_size``."""
        drafts = request.spec_token_ids
        if not drafts:
            return []
        limit = self.spec.disable_by_batch_size
        if limit is not None and num_running >= limit:
            return []
        if request.structured_output is not None:  # only what the grammar accepts can be emitted
            from host.core.structured_output.engine import StructuredOutputManager

            drafts = StructuredOutputManager.valid_drafts(request, list(drafts))
            if not drafts:
                return []
        auto = self._auto.get(request.request_id)
        if auto is not None and auto.off_steps_left > 0:
            auto.off_steps_left -= 1
            return []
        # the step computes num_tokens - num_computed (one, for a decode) plus d drafts; the
        # emitted tokens are at most d + 1, so d + 1 <= what max_tokens and max_model_len leave
        left_tokens = request.sampling_params.max_tokens - request.num_output_tokens
        left_len = self.max_model_len - request.num_tokens
        d = min(len(drafts), self.k, budget - 1, left_tokens - 1, left_len - 1)
        return list(drafts[:d]) if d > 0 else []

    def record(self, req_id: str, num_drafted: int, num_accepted: int) -> None:
        """After a step: ``req_id`` verified ``num_drafted`` drafts and accepted the first
        ``num_accepted``; feeds the stats and the request's auto-off window."""
        if num_drafted <= 0:
            return
        self.counts.observe(num_drafted, num_accepted)
        threshold = self.spec.auto_off_threshold
        if threshold <= 0:
            return
        auto = self._auto.setdefault(req_id, _AutoOff())
        auto.window.append(num_accepted / num_drafted)
        window = self.spec.auto_off_window
        if len(auto.window) > window:
            auto.window.popleft()
        needed = window if auto.strikes == 0 else max(2, window // 4)  # a probe is judged sooner
        if len(auto.window) < needed:
            return
        if sum(auto.window) / len(auto.window) < threshold:
            auto.window.clear()
            auto.off_steps_left = self.spec.auto_off_probe_steps * 2 ** min(auto.strikes, 3)
            auto.strikes += 1
            logger.debug("speculation off for request %s for %d steps (low acceptance)", req_id, auto.off_steps_left)
        else:
            auto.strikes = 0  # a probe passed: back to the full window

    def is_off(self, req_id: str) -> bool:
        """Whether the auto-off holds ``req_id``'s drafts back now."""
        auto = self._auto.get(req_id)
        return auto is not None and auto.off_steps_left > 0

    def take_tokens(self, request: "Request", new_token_ids: list[int], num_emitted: int, index: int,
                    scheduler_output: "SchedulerOutput", runner_output: "ModelRunnerOutput") -> None:
        """After ``request``'s tokens of a step are appended: count its verified drafts, roll
        ``num_computed_tokens`` back by the rejected ones (their KV is overwritten later), and
        keep the proposer's drafts for its next step."""
        next_drafts = runner_output.spec_token_ids
        drafted = len(scheduler_output.scheduled_spec_decode_tokens.get(request.request_id, ()))
        accepted = max(0, num_emitted - 1)
        self.record(request.request_id, drafted, accepted)
        if request.is_finished():
            return
        request.num_computed_tokens -= drafted - accepted
        request.spec_token_ids = list(next_drafts[index]) if next_drafts else []
        return None

    def finished(self, request: "Request", was: "RequestStatus") -> None:
        self._auto.pop(request.request_id, None)

    def stats(self, stats: "SchedulerStats", running: list["Request"], waiting: Any) -> None:
        stats.spec_decoding = self.totals()

    def totals(self) -> SpecDecodingStats:
        """A copy of the counts since start-up (``SchedulerStats.spec_decoding``)."""
        return msgspec.structs.replace(self.counts, num_accepted_tokens_per_pos=list(self.counts.num_accepted_tokens_per_pos))
