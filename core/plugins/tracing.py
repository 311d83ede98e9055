"""Hook-call tracing (``HOST_TRACE_PLUGINS=1``): every hook call logged to stderr, with its
arguments, the implementations it reaches, its result and how long each one took."""

from __future__ import annotations

import logging
import sys
from typing import Any, Callable

import pluggy

trace_logger = logging.getLogger("host.plugins.trace")


def fmt_kwargs(kwargs: dict[str, Any]) -> str:
    """Hook arguments for a trace line; callables (``register``) print as ``<callable>``."""
    return ", ".join(f"{k}={v!r}" if not callable(v) else f"{k}=<callable>" for k, v in kwargs.items())


def ensure_trace_handler() -> None:
    """Send trace lines to stderr, tagged with the pid, unless a handler is already set."""
    if not trace_logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[host trace pid=%(process)d] %(message)s"))
        trace_logger.addHandler(handler)
        trace_logger.setLevel(logging.INFO)
        trace_logger.propagate = False


def monitor_hook_calls(pm: pluggy.PluginManager) -> Callable[[], None]:
    """Log every hook call made through ``pm.hook``; returns the function that stops it."""
    ensure_trace_handler()

    def before(hook_name: str, hook_impls: list[Any], kwargs: dict[str, Any]) -> None:
        trace_logger.info(
            "call %s(%s) -> [%s]",
            hook_name,
            fmt_kwargs(kwargs),
            ", ".join(i.plugin_name for i in hook_impls),
        )

    def after(outcome: Any, hook_name: str, hook_impls: list[Any], kwargs: dict[str, Any]) -> None:
        exc = outcome.exception
        trace_logger.info("done %s: %s", hook_name, f"raised {exc!r}" if exc else repr(outcome.get_result()))

    return pm.add_hookcall_monitoring(before, after)


def trace_call(plugin: str, hook_name: str, kwargs: dict[str, Any]) -> None:
    """Log one implementation about to be called directly (not through ``pm.hook``)."""
    trace_logger.info("call %s -> %s(%s)", plugin, hook_name, fmt_kwargs(kwargs))


def trace_done(plugin: str, hook_name: str, seconds: float, result: Any) -> None:
    """Log the result of one directly called implementation."""
    trace_logger.info("done %s -> %s in %.3f ms: %r", plugin, hook_name, seconds * 1e3, result)
