"""Stat loggers: sinks for the engine's per-step metrics. They run in the API process.

A ``host.stat_loggers`` plugin registers :class:`StatLogger` subclasses. The server creates one
instance of each selected logger per engine (``cls(context, arg)``). After every engine step it
calls ``record(scheduler_stats, iteration_stats)``, and it calls ``log()`` every
``--log-stats-interval`` seconds. ``shutdown()`` is called once when the server stops.

Which loggers run:

- every registered logger whose ``enabled_by_default`` is true;
- plus each one named in ``--stat-loggers NAME[:ARG],...``. ``ARG`` reaches ``__init__`` as
  ``arg``. A logger that takes an argument says what it means in ``argument``. Naming a logger
  that is not registered, or giving an argument to a logger that takes none, is a start-up
  ``ValueError``.

``--disable-log-stats`` turns off the built-in ``logging`` logger.

The data types are plain dataclasses defined here, and a plugin reads their fields:

- ``scheduler_stats`` is the engine's snapshot after the step: ``num_running_reqs``,
  ``num_waiting_reqs``, ``num_waiting_deferred``, ``kv_cache_usage`` (0-1), and the totals since
  start-up ``prefix_cache_queries``, ``prefix_cache_hits`` and ``num_preemptions``. It is
  ``None`` in a call that only reports requests the front end ended (aborts).
- ``iteration_stats`` is an :class:`IterationStats`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass
class FinishedRequestStats:
    """One prompt that ended (all of its ``n`` samples), as the metrics see it.

    The times are in seconds, and each is 0.0 when the request never reached that point (e.g.
    it was aborted while waiting):

    - ``e2e_latency``: from arrival at the front end to the end;
    - ``queued_time``: from entering the engine's waiting queue to being first scheduled;
    - ``prefill_time``: from first scheduled to the first token;
    - ``decode_time``: from the first token to the last one;
    - ``inference_time``: prefill plus decode;
    - ``mean_time_per_output_token``: ``decode_time / (tokens - 1)``, over the longest sample.

    ``finish_reasons`` holds one reason per sample (``"stop"``, ``"length"`` or ``"abort"``).
    ``finish_reason`` is the first of them.
    """

    request_id: str
    finish_reasons: list[str]
    num_prompt_tokens: int
    num_generation_tokens: int  # over all samples
    max_num_generation_tokens: int  # the longest sample
    num_cached_tokens: int  # prompt tokens found in the prefix cache
    n: int
    max_tokens: int | None
    e2e_latency: float
    queued_time: float = 0.0
    prefill_time: float = 0.0
    decode_time: float = 0.0
    inference_time: float = 0.0
    mean_time_per_output_token: float = 0.0
    num_preemptions: int = 0

    @property
    def finish_reason(self) -> str:
        return self.finish_reasons[0] if self.finish_reasons else "abort"


@dataclass
class IterationStats:
    """What one engine step changed, as counted in the front end.

    - ``num_prompt_tokens``: prompt tokens whose prefill ended this step (counted when a
      sample's first token arrived; a prompt with ``n`` samples counts ``n`` times);
    - ``num_generation_tokens``: tokens generated this step;
    - ``time_to_first_tokens``: one entry per prompt that got its first token, in seconds
      from its arrival;
    - ``inter_token_latencies``: one entry per sample that got further tokens, the seconds
      since its previous ones;
    - ``num_preemptions``, ``prefix_cache_queries`` and ``prefix_cache_hits``: this step's share
      of the scheduler's totals;
    - ``finished_requests``: the prompts that ended this step;
    - ``num_requests_in_flight``: the prompts the API server is serving after it.

    ``timestamp`` is when the stats were made (``time.monotonic()``).
    """

    timestamp: float
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    time_to_first_tokens: list[float] = field(default_factory=list)
    inter_token_latencies: list[float] = field(default_factory=list)
    num_preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)
    num_requests_in_flight: int = 0


@dataclass
class StatLoggerContext:
    """What a logger may need to know about the server it runs in.

    - ``config``: the ``EngineConfig``;
    - ``model_name``: the served model name (the ``model_name`` label);
    - ``metrics_prefix``: the metric names' prefix, ``vllm`` (the default, vLLM's names) or
      ``host`` (``--metrics-prefix``);
    - ``registry``: the ``prometheus_client.CollectorRegistry`` that ``/metrics`` renders;
    - ``engine_info``: what the engine reported at start-up (``num_gpu_blocks``,
      ``block_size``, ``platform``, ...);
    - ``log_interval``: the seconds between ``log()`` calls.
    """

    config: Any = None
    model_name: str = "default"
    engine_index: int = 0
    metrics_prefix: str = "vllm"
    registry: Any = None
    engine_info: dict[str, Any] = field(default_factory=dict)
    log_interval: float = 10.0


class StatLogger:
    """Receives scheduler and iteration stats after every engine step (see the module doc).

    Subclasses set ``name`` (the key ``--stat-loggers`` selects them by) and implement
    ``record``. ``record`` runs on the server's event loop after each step, so it must be quick:
    no blocking I/O beyond a buffered write.
    """

    name: ClassVar[str] = ""
    enabled_by_default: ClassVar[bool] = True
    argument: ClassVar[str | None] = None  # what NAME:ARG means; None: the logger takes no argument

    def __init__(self, context: StatLoggerContext | None = None, arg: str | None = None) -> None:
        if arg is not None and self.argument is None:
            raise ValueError(
                f"stat logger {self.name!r} takes no argument, got {arg!r}; "
                f"write --stat-loggers {self.name} without ':{arg}'"
            )
        self.context = context if context is not None else StatLoggerContext()
        self.config = self.context.config
        self.engine_index = self.context.engine_index
        self.arg = arg

    def record(self, scheduler_stats: Any, iteration_stats: IterationStats | None) -> None:
        raise NotImplementedError

    def log(self) -> None:
        """Emit what was recorded (called every ``log_interval`` seconds); default: nothing."""

    def log_engine_initialized(self) -> None:
        """Called once when the engine is up; default: nothing."""

    def shutdown(self) -> None:
        """Called once when the server stops (flush and close files); default: nothing."""
