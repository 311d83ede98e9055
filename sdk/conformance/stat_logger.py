"""The stat-logger suite: a logger takes real per-step stats, logs, and shuts down twice without raising."""

from __future__ import annotations

import time
from typing import Any, ClassVar

from host.sdk.conformance.base import RegistrationCheck
from host.sdk.stat_logger import StatLogger


class StatLoggerConformance(RegistrationCheck):
    """Set ``logger`` (the :class:`StatLogger` subclass). Optional: ``arg`` (what
    ``--stat-loggers name=ARG`` would pass; ``tmp_path`` is given to :meth:`make_arg`)."""

    logger: ClassVar[type[StatLogger] | None] = None
    registry_kind = "stat_loggers"
    group = "host.stat_loggers"

    def registered_name(self) -> str:
        return self.logger.name

    def make_arg(self, tmp_path: Any) -> str | None:
        return None

    def test_records_logs_and_shuts_down(self, tmp_path: Any) -> None:
        from host.contracts.messages import SchedulerStats
        from host.sdk.stat_logger import FinishedRequestStats, IterationStats, StatLoggerContext

        assert self.logger is not None, "set `logger` to your StatLogger subclass"
        assert self.logger.name, "set the class field `name`"
        instance = self.logger(StatLoggerContext(model_name="conformance", engine_index=0), self.make_arg(tmp_path))
        instance.log_engine_initialized()
        for step in range(3):
            stats = SchedulerStats(num_running_reqs=2, num_waiting_reqs=step, kv_cache_usage=0.25)
            it = IterationStats(timestamp=time.time(), num_prompt_tokens=16, num_generation_tokens=2)
            if step == 2:
                it.finished_requests.append(FinishedRequestStats(
                    request_id="conformance-1", finish_reasons=["stop"], num_prompt_tokens=16, num_generation_tokens=3,
                    max_num_generation_tokens=3, num_cached_tokens=8, n=1, max_tokens=16, queued_time=0.01,
                    e2e_latency=0.06, prefill_time=0.02, decode_time=0.03, inference_time=0.05, mean_time_per_output_token=0.01,
                ))
            instance.record(stats, it)
            instance.record(stats, None)  # a step without iteration stats (an idle poll)
            instance.log()
        instance.shutdown()
        instance.shutdown()
