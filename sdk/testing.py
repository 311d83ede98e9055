"""Testing kit for plugin authors (and host's own tests).

Register an in-memory plugin for one test and have it removed afterwards, against an isolated
plugin host that sees only host's built-in plugins (no third-party autoload)::

    from host.sdk import hookimpl
    from host.sdk.testing import isolated_plugin_host, registered_plugin

    class MyModels:
        @hookimpl
        def host_register_models(self, register):
            register("MyArch", "my_pkg.model:MyModel")

    def test_my_arch_is_registered():
        with isolated_plugin_host() as host, registered_plugin(MyModels(), name="mine"):
            assert "MyArch" in host.registry("models")

With pytest, add ``pytest_plugins = ["host.sdk.testing"]`` to your ``conftest.py`` and use the
``plugin_host`` and ``register_plugin`` fixtures instead.

Each plugin family has a conformance suite here (:mod:`host.sdk.conformance`): subclass it under
a ``Test...`` name, set the plugin it checks, and pytest runs the family's contract against it::

    from host.sdk.testing import AttentionBackendConformance

    class TestMyBackend(AttentionBackendConformance):
        backend = MyAttentionBackend
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Iterator

from host.core.plugins.discovery import Candidate, discover_entry_points
from host.core.plugins.manager import PluginHost, get_plugin_host, set_plugin_host
from host.core.plugins.records import PluginRecord
from host.core.plugins.settings import PluginSettings
from host.hooks.groups import GENERAL_GROUP, GROUPS
from host.sdk.conformance import (  # noqa: F401 - the suites, re-exported for plugin tests
    AttentionBackendConformance,
    EndpointConformance,
    ExecutorConformance,
    IOProcessorConformance,
    KVConnectorConformance,
    ModelConformance,
    PlatformConformance,
    QuantizationMethodConformance,
    ReasoningParserConformance,
    StatLoggerConformance,
    ToolParserConformance,
)


def discover_builtins_only(groups: Iterable[str]) -> list[Candidate]:
    """Entry-point discovery limited to host's own built-in plugins."""
    return [c for c in discover_entry_points(groups) if c.builtin]


def _reset_platform_cache() -> None:
    from host.core.plugins.platform import reset_current_platform

    reset_current_platform()


@contextlib.contextmanager
def isolated_plugin_host(
    settings: PluginSettings | None = None,
    *,
    builtins: bool = True,
    load_all_groups: bool = True,
) -> Iterator[PluginHost]:
    """Swap in a fresh plugin host for this process; restore the previous one on exit.

    ``builtins=False`` discovers nothing at all; ``load_all_groups`` loads every group up front
    so in-memory plugins of any group are callable at once.
    """
    host = PluginHost(settings or PluginSettings(), discover=discover_builtins_only if builtins else None)
    previous = set_plugin_host(host)
    _reset_platform_cache()
    try:
        if load_all_groups:
            host.load_groups(GROUPS)
        yield host
    finally:
        set_plugin_host(previous)
        _reset_platform_cache()


@contextlib.contextmanager
def registered_plugin(
    plugin: Any,
    name: str | None = None,
    group: str = GENERAL_GROUP,
    host: PluginHost | None = None,
) -> Iterator[PluginRecord]:
    """Register ``plugin`` (a module, class instance or object with ``@hookimpl`` methods) as if
    it were installed under ``group``; unregister it on exit."""
    host = host or get_plugin_host()
    name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
    record = host.register_object(plugin, name=name, group=group)
    _reset_platform_cache()
    try:
        yield record
    finally:
        host.unregister_object(name, group)
        _reset_platform_cache()


# -- pytest fixtures (``pytest_plugins = ["host.sdk.testing"]``) ------------------------------
try:
    import pytest
except ImportError:  # pragma: no cover - pytest is optional for the runtime
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    @pytest.fixture
    def plugin_host() -> Iterator[PluginHost]:
        """An isolated plugin host with only the built-ins, installed for this test."""
        with isolated_plugin_host() as host:
            yield host

    @pytest.fixture
    def register_plugin(plugin_host: PluginHost) -> Iterator[Callable[..., PluginRecord]]:
        """``register_plugin(obj, name=None, group="host.general")``; removed after the test."""
        stack = contextlib.ExitStack()

        def register(plugin: Any, name: str | None = None, group: str = GENERAL_GROUP) -> PluginRecord:
            return stack.enter_context(registered_plugin(plugin, name, group, plugin_host))

        with stack:
            yield register
