"""host.sdk.testing: in-memory plugins for one test, removed afterwards."""

from __future__ import annotations

import pytest

from host.core.plugins.manager import PluginError, get_plugin_host
from host.sdk import AttentionBackend, hookimpl
from host.sdk.testing import isolated_plugin_host, registered_plugin


class TinyBackend(AttentionBackend):
    name = "tiny_test_backend"
    device_types = ("cpu",)


class BackendPlugin:
    @hookimpl
    def host_register_attention_backends(self, register):
        register(TinyBackend)


def test_context_managers_register_and_remove():
    outer = get_plugin_host()
    with isolated_plugin_host() as host:
        assert get_plugin_host() is host
        with registered_plugin(BackendPlugin(), name="tiny", group="host.attention_backends") as rec:
            assert rec.status == "loaded" and rec.hooks == ["host_register_attention_backends"]
            assert host.registry("attention_backends")["tiny_test_backend"] is TinyBackend
        assert "tiny_test_backend" not in host.registry("attention_backends")
        assert "host.attention_backends:tiny" not in host.records
    assert get_plugin_host() is outer


def test_fixtures(plugin_host, register_plugin):
    register_plugin(BackendPlugin(), name="tiny", group="host.attention_backends")
    assert "tiny_test_backend" in plugin_host.registry("attention_backends")
    # isolated host: only built-ins are discovered
    assert all(r.builtin or r.distribution == "<in-memory>" for r in plugin_host.list_records())


def test_in_memory_plugins_obey_the_group_rule(plugin_host):
    with pytest.raises(PluginError, match="host_register_attention_backends"):
        with registered_plugin(BackendPlugin(), name="misplaced", group="host.endpoints"):
            pass


def test_general_hooks_are_allowed_in_any_group(plugin_host, register_plugin):
    seen = []

    class Models:
        @hookimpl
        def host_register_models(self, register):
            register("TinyArch", "tests.nowhere:Tiny")

        @hookimpl
        def host_adjust_config(self, config):
            seen.append(config)

    register_plugin(Models(), name="models_and_config", group="host.models")
    assert plugin_host.registry("models")["TinyArch"] == "tests.nowhere:Tiny"
    plugin_host.pm.hook.host_adjust_config(config="cfg")
    assert seen == ["cfg"]
    with pytest.raises(PluginError, match="host_register_models"):  # the reverse is refused
        with registered_plugin(Models(), name="misplaced_models", group="host.general"):
            pass
