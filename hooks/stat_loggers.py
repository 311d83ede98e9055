"""Hooks of the ``host.stat_loggers`` family: metrics sinks.

Loaded in the API process only, where per-step engine stats are aggregated.
"""

from __future__ import annotations

from typing import Callable

from host.hooks.markers import hookspec

# this family's entry-point group and where it loads (gathered by host.hooks.groups)
GROUP = "host.stat_loggers"
LOADED_IN = ("api",)
LAZY_IN: tuple[str, ...] = ()
SUMMARY = "metrics sinks"


@hookspec
def host_register_stat_loggers(register: Callable[..., None]) -> None:
    """Offer :class:`host.sdk.StatLogger` subclasses.

    Call ``register(logger_class)``; ``logger_class.name`` is the key ``--stat-loggers``
    selects it by. The API server creates each selected logger once per engine, as
    ``logger_class(context, arg)``, and calls ``record(scheduler_stats, iteration_stats)`` after
    every engine step, ``log()`` every ``--log-stats-interval`` seconds and ``shutdown()`` at
    exit (see :mod:`host.interfaces.stat_logger`).
    """
