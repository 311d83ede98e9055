"""The host-owned registries: the collector table derived from the hook names, and the
``register(...)`` callbacks that fill a registry."""

from __future__ import annotations

import pytest

from host.core.plugins.errors import PluginError
from host.core.plugins.records import PluginRecord
from host.core.plugins.registry import COLLECTORS, REGISTRY_HOOK, Registry, collector_hook, collector_table
from host.hooks.groups import all_hook_names
from host.sdk import hookimpl


def test_collectors_are_every_register_hook_with_its_kind():
    assert COLLECTORS == {
        "host_register_platforms": "platforms",
        "host_register_attention_backends": "attention_backends",
        "host_register_quantization_methods": "quantization_methods",
        "host_register_kv_connectors": "kv_connectors",
        "host_register_executors": "executors",
        "host_register_io_processors": "io_processors",
        "host_register_endpoints": "endpoints",
        "host_register_stat_loggers": "stat_loggers",
        "host_register_tool_parsers": "tool_parsers",
        "host_register_reasoning_parsers": "reasoning_parsers",
        "host_register_models": "models",
        "host_register_eplb_policies": "eplb_policies",
    }
    assert set(COLLECTORS) == {h for h in all_hook_names() if h.startswith("host_register_")}
    assert REGISTRY_HOOK["quantization_methods"] == "host_register_quantization_methods"


def test_collector_table_derives_from_names():
    table = collector_table(["host_startup", "host_register_widgets", "host_select_widget", "host_register_lora_adapters"])
    assert table == {"host_register_widgets": "widgets", "host_register_lora_adapters": "lora_adapters"}


def test_unknown_registry_kind_lists_the_kinds():
    with pytest.raises(ValueError, match="unknown registry 'platform'.*platforms"):
        collector_hook("platform")


def test_register_keys_by_name_or_string_and_records_it():
    class Thing:
        name = "thing"

    record = PluginRecord("p", "host.general", "v", "d", "", False, ("api",), "loaded")
    reg = Registry("things")
    register = reg.register_for("host.general:p", record)
    register(Thing)
    register("Arch", "pkg.mod:Cls")
    register(Thing)  # the same plugin again: no duplicate entry
    assert reg.entries == {"thing": Thing, "Arch": "pkg.mod:Cls"}
    assert reg.owners == {"thing": "host.general:p", "Arch": "host.general:p"}
    assert record.registered == ["things:thing", "things:Arch"]
    with pytest.raises(PluginError, match="'Arch' is registered by both host.general:p and host.general:q"):
        reg.register_for("host.general:q", None)("Arch", "other:Cls")
    with pytest.raises(ValueError, match="no non-empty string 'name'"):
        register(object())


def test_registry_through_the_host(plugin_host, register_plugin):
    class Widgets:
        @hookimpl
        def host_register_models(self, register):
            register("WidgetForCausalLM", "widgets.model:Widget")

    register_plugin(Widgets(), name="widgets", group="host.models")
    assert plugin_host.registry("models")["WidgetForCausalLM"] == "widgets.model:Widget"
    assert plugin_host.registry_owner("models", "WidgetForCausalLM") == "host.models:widgets"
    assert plugin_host.records["host.models:widgets"].registered == ["models:WidgetForCausalLM"]
