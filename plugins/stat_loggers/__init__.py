"""Built-in stat loggers (entry point ``host.stat_loggers: builtin_stat_loggers``), loaded in
the API process:

- ``prometheus``: the metrics ``/metrics`` shows, under vLLM's names (``--metrics-prefix``);
- ``logging``: one INFO line every ``--log-stats-interval`` seconds (off with
  ``--disable-log-stats``);
- ``jsonl``: every record as one JSON line in a file (``--stat-loggers jsonl:PATH``).
"""

from __future__ import annotations

from typing import Callable

from host.plugins.stat_loggers.jsonl import JsonlStatLogger
from host.plugins.stat_loggers.logging_logger import LoggingStatLogger
from host.plugins.stat_loggers.prometheus import PrometheusStatLogger
from host.sdk import hookimpl

__all__ = ["JsonlStatLogger", "LoggingStatLogger", "PrometheusStatLogger"]


@hookimpl
def host_register_stat_loggers(register: Callable[..., None]) -> None:
    register(PrometheusStatLogger)
    register(LoggingStatLogger)
    register(JsonlStatLogger)
