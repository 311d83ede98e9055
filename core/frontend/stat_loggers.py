"""The stat-logger manager: after each engine step, build the metrics and hand them to every
stat logger. It runs in the API process.

:class:`StatLoggerManager` selects the loggers of the ``stat_loggers`` registry (see
:mod:`host.interfaces.stat_logger` for which ones run) and creates one instance of each. For every
engine step it builds one :class:`~host.interfaces.stat_logger.IterationStats` from the output
processor's :class:`~host.core.frontend.output_processor.ProcessedOutputs` and from the
scheduler's totals (this step's share of preemptions and prefix-cache lookups), then calls
``record`` on each logger. With ``-dp N`` there is one instance of each logger per engine
(its context's ``engine_index`` set, the ``engine`` label of ``/metrics``), and each engine's
steps go to its own instances. A prompt that the front end ends (a client that went away, or an
engine error) is reported at once, in a ``record(None, stats)`` call that carries only that
prompt. A background task calls ``log()`` every ``log_interval`` seconds.

One failing logger never breaks serving: its exception is logged once, and that logger and the
others keep being called.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Iterable

from host.contracts.messages import SchedulerStats
from host.contracts.sampling_params import SamplingParams
from host.core.frontend.output_processor import ProcessedOutputs, RequestOutput, RequestTiming
from host.interfaces.stat_logger import FinishedRequestStats, IterationStats, StatLogger, StatLoggerContext

logger = logging.getLogger("host.stat_loggers")


def parse_stat_logger_specs(specs: Iterable[str]) -> dict[str, str | None]:
    """``["jsonl:/tmp/s.jsonl", "mine"]`` (each item may itself be a comma list) ->
    ``{"jsonl": "/tmp/s.jsonl", "mine": None}``."""
    out: dict[str, str | None] = {}
    for item in specs:
        for spec in item.split(","):
            spec = spec.strip()
            if not spec:
                continue
            name, sep, arg = spec.partition(":")
            if not name:
                raise ValueError(f"--stat-loggers entry {spec!r} has no logger name; write NAME or NAME:ARG")
            out[name] = arg if sep else None
    return out


def select_stat_loggers(
    registry: dict[str, type[StatLogger]], specs: Iterable[str] = (), disable_log_stats: bool = False
) -> dict[str, str | None]:
    """The loggers to run, by name, each with its argument: every logger that is enabled by
    default, plus those named in ``specs``, minus ``logging`` when ``disable_log_stats`` is set.
    Raises ``ValueError`` for a name that is not registered."""
    named = parse_stat_logger_specs(specs)
    unknown = [n for n in named if n not in registry]
    if unknown:
        raise ValueError(
            f"unknown stat logger(s) {', '.join(map(repr, unknown))} in --stat-loggers; "
            f"registered: {', '.join(sorted(registry)) or 'none'} (`host plugins list` shows the plugins)"
        )
    chosen: dict[str, str | None] = {n: None for n, cls in registry.items() if getattr(cls, "enabled_by_default", True)}
    chosen.update(named)
    if disable_log_stats:
        chosen.pop("logging", None)
    return chosen


class StatLoggerManager:
    """Every stat logger of one server, fed after each engine step."""

    def __init__(self, loggers: list[StatLogger], log_interval: float = 10.0, per_engine: list[list[StatLogger]] | None = None) -> None:
        """``loggers`` are fed every step; with ``per_engine`` (one list per data-parallel
        engine, together ``loggers``) engine ``i``'s steps go to ``per_engine[i]`` only."""
        if log_interval <= 0:
            raise ValueError(f"log_stats_interval={log_interval} must be > 0 seconds, e.g. 10")
        self.loggers = loggers
        self.per_engine = per_engine if per_engine is not None else [loggers]
        self.log_interval = log_interval
        self._last: dict[int, SchedulerStats] = {}  # per engine
        self._failed: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def create(
        cls,
        registry: dict[str, type[StatLogger]],
        context: StatLoggerContext,
        specs: Iterable[str] = (),
        disable_log_stats: bool = False,
    ) -> "StatLoggerManager":
        """Select the loggers (:func:`select_stat_loggers`) and create each one with ``context``:
        once per data-parallel engine (``context.config.parallel.data_parallel_size``), each
        with a copy of ``context`` whose ``engine_index`` is that engine's."""
        chosen = select_stat_loggers(registry, specs, disable_log_stats)
        parallel = getattr(context.config, "parallel", None)
        engines = getattr(parallel, "data_parallel_size", 1)
        contexts = [context] if engines == 1 else [dataclasses.replace(context, engine_index=i) for i in range(engines)]
        per_engine = [[registry[name](ctx, arg) for name, arg in chosen.items()] for ctx in contexts]
        return cls([lg for group in per_engine for lg in group], context.log_interval, per_engine)

    @property
    def names(self) -> list[str]:
        return [type(lg).name for lg in self.loggers]

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Tell the loggers the engine is up and start the periodic ``log()`` task."""
        self._each("log_engine_initialized")
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._log_loop())

    async def _log_loop(self) -> None:
        while True:
            await asyncio.sleep(self.log_interval)
            self._each("log")

    def shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._each("log")
        self._each("shutdown")

    # -- stats --------------------------------------------------------------------------------
    def on_step(
        self, scheduler_stats: SchedulerStats | None, done: ProcessedOutputs | None, in_flight: int = 0, engine_index: int = 0
    ) -> None:
        """One engine step's outputs (``done``, already processed) and the scheduler snapshot
        that came with them, from data-parallel engine ``engine_index``."""
        now = time.monotonic()
        stats = IterationStats(timestamp=now, num_requests_in_flight=in_flight)
        if done is not None:
            stats.num_prompt_tokens = done.num_prompt_tokens
            stats.num_generation_tokens = done.num_generation_tokens
            stats.time_to_first_tokens = done.time_to_first_tokens
            stats.inter_token_latencies = done.inter_token_latencies
            stats.finished_requests = [finished_stats(f.result, f.timing, f.params, now) for f in done.finished]
        if scheduler_stats is not None:
            last = self._last.get(engine_index)
            if last is not None:
                stats.num_preemptions = max(scheduler_stats.num_preemptions - last.num_preemptions, 0)
                stats.prefix_cache_queries = max(scheduler_stats.prefix_cache_queries - last.prefix_cache_queries, 0)
                stats.prefix_cache_hits = max(scheduler_stats.prefix_cache_hits - last.prefix_cache_hits, 0)
            else:
                stats.num_preemptions = scheduler_stats.num_preemptions
                stats.prefix_cache_queries = scheduler_stats.prefix_cache_queries
                stats.prefix_cache_hits = scheduler_stats.prefix_cache_hits
            self._last[engine_index] = scheduler_stats
        self._record(scheduler_stats, stats, engine_index)

    def on_ended(
        self, result: RequestOutput, timing: RequestTiming | None, params: SamplingParams, in_flight: int = 0, engine_index: int = 0
    ) -> None:
        """A prompt the front end ended before the engine finished it (a client that went away,
        an engine error): its unfinished samples count as ``"abort"`` (on ``engine_index``'s
        loggers)."""
        now = time.monotonic()
        stats = IterationStats(timestamp=now, num_requests_in_flight=in_flight)
        stats.finished_requests = [finished_stats(result, timing or RequestTiming(now), params, now)]
        self._record(None, stats, engine_index)

    def _record(self, scheduler_stats: SchedulerStats | None, stats: IterationStats, engine_index: int = 0) -> None:
        group = self.per_engine[engine_index] if 0 <= engine_index < len(self.per_engine) else self.per_engine[0]
        for lg in group:
            try:
                lg.record(scheduler_stats, stats)
            except Exception:  # noqa: BLE001 - one broken sink must not stop serving
                self._fail(lg, "record")

    def _each(self, method: str) -> None:
        for lg in self.loggers:
            try:
                getattr(lg, method)()
            except Exception:  # noqa: BLE001
                self._fail(lg, method)

    def _fail(self, lg: StatLogger, method: str) -> None:
        key = f"{type(lg).name}.{method}"
        if key not in self._failed:
            self._failed.add(key)
            logger.exception("stat logger %r failed in %s() (logged once; it keeps being called)", type(lg).name, method)


def finished_stats(
    result: RequestOutput, timing: RequestTiming, params: SamplingParams, now: float
) -> FinishedRequestStats:
    """The metrics of one ended prompt, from its result and timings (see
    :class:`~host.interfaces.stat_logger.FinishedRequestStats`)."""
    reasons = [c.finish_reason or "abort" for c in result.outputs] or ["abort"]
    lengths = [len(c.token_ids) for c in result.outputs] or [0]
    out = FinishedRequestStats(
        request_id=result.request_id,
        finish_reasons=reasons,
        num_prompt_tokens=len(result.prompt_token_ids),
        num_generation_tokens=sum(lengths),
        max_num_generation_tokens=max(lengths),
        num_cached_tokens=result.num_cached_tokens,
        n=params.n,
        max_tokens=params.max_tokens,
        e2e_latency=max((timing.finished_at or now) - timing.arrival, 0.0),
        num_preemptions=timing.num_preemptions,
    )
    if timing.queued is not None and timing.scheduled is not None:
        out.queued_time = max(timing.scheduled - timing.queued, 0.0)
    if timing.scheduled is not None and timing.first_token is not None:
        out.prefill_time = max(timing.first_token - timing.scheduled, 0.0)
        last = timing.last_token if timing.last_token is not None else timing.first_token
        out.decode_time = max(last - timing.first_token, 0.0)
        out.inference_time = out.prefill_time + out.decode_time
        if max(lengths) > 1:
            out.mean_time_per_output_token = out.decode_time / (max(lengths) - 1)
    return out
