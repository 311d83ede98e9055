"""``HOST_TRACE_PLUGINS``: every hook call, through ``pm.hook`` or called one by one, is logged."""

from __future__ import annotations

import logging

from host.core.plugins.manager import PluginHost
from host.core.plugins.settings import PluginSettings
from host.core.plugins.tracing import fmt_kwargs, trace_logger
from host.sdk import hookimpl


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class Models:
    @hookimpl
    def host_register_models(self, register):
        register("TracedForCausalLM", "traced.model:Traced")


def traced(trace: bool) -> list[str]:
    host = PluginHost(PluginSettings(trace=trace), discover=None)  # tracing sets up its logger
    handler = Lines()
    trace_logger.addHandler(handler)
    try:
        host.register_object(Models(), name="traced", group="host.models")
        host.registry("models")  # called one implementation at a time
        host.pm.hook.host_startup(process="api")  # called through pm.hook
    finally:
        trace_logger.removeHandler(handler)
    return handler.lines


def test_trace_logs_each_call_and_its_result():
    lines = traced(True)
    assert "call host.models:traced -> host_register_models(register=<callable>)" in lines
    assert any(line.startswith("done host.models:traced -> host_register_models in ") for line in lines)
    assert "call host_startup(process='api') -> []" in lines
    assert "done host_startup: []" in lines


def test_no_trace_without_the_setting():
    assert traced(False) == []


def test_fmt_kwargs_hides_callables():
    assert fmt_kwargs({"process": "api", "register": print}) == "process='api', register=<callable>"
