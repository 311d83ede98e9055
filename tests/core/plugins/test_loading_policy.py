"""Allowlist, blocklist, default-deny endpoints, failures and strict mode, with real pip-installed
fixture plugins discovered through their entry points."""

from __future__ import annotations

import logging

import pytest

from helpers import on_sys_path
from host.core.plugins.manager import PluginConfigError, PluginError, PluginHost
from host.core.plugins.settings import PluginSettings, parse_name_list
from host.hooks.groups import GROUPS

ALL_GROUPS = list(GROUPS)


def statuses(host: PluginHost) -> dict[str, str]:
    return {r.name: r.status for r in host.list_records()}


def load(sites: list[str], settings: PluginSettings, groups=ALL_GROUPS, raise_on_fatal=False) -> PluginHost:
    with on_sys_path(*sites):
        host = PluginHost(settings)
        host.check_settings()
        host.load_groups(groups, raise_on_fatal=raise_on_fatal)
        return host


def test_parse_name_list_rules():
    assert parse_name_list(None) is None  # unset: no allowlist
    assert parse_name_list("") == []  # empty string: an allowlist that names nothing
    assert parse_name_list(" a , b,, ") == ["a", "b"]


def test_env_settings(monkeypatch):
    monkeypatch.setenv("HOST_PLUGINS", "")
    monkeypatch.setenv("HOST_BLOCK_PLUGINS", "cuda")
    monkeypatch.setenv("HOST_STRICT_PLUGINS", "1")
    s = PluginSettings.from_env()
    assert s.allow == () and s.block == ("cuda",) and s.strict
    # a flag overrides its variable
    assert PluginSettings.from_env(plugins="x").allow == ("x",)
    monkeypatch.delenv("HOST_PLUGINS")
    assert PluginSettings.from_env().allow is None


def test_allowlist_unset_loads_everything_but_third_party_endpoints(fixture_sites, caplog):
    sites = [fixture_sites["recorder"], fixture_sites["endpoint"]]
    with caplog.at_level(logging.WARNING, logger="host.plugins"):
        host = load(sites, PluginSettings())
    st = statuses(host)
    for name in ("recorder_general", "recorder_attention", "recorder_io", "recorder_stats", "recorder_kv"):
        assert st[name] == "loaded"
    assert st["fixture_hello"] == "not-allowlisted"
    assert st["cpu"] == "loaded" and st["builtin_endpoints"] == "loaded"
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert "fixture_hello" in warning and "--plugins fixture_hello" in warning
    assert "HOST_PLUGINS=fixture_hello" in warning
    # the denied endpoint registers nothing
    assert "fixture_hello" not in host.registry("endpoints")


def test_allowlist_set_loads_only_listed_third_party(fixture_sites):
    sites = [fixture_sites["recorder"], fixture_sites["endpoint"]]
    host = load(sites, PluginSettings(allow=("recorder_attention", "fixture_hello")))
    st = statuses(host)
    assert st["recorder_attention"] == "loaded"
    assert st["fixture_hello"] == "loaded"
    assert st["recorder_general"] == "not-allowlisted"
    assert st["recorder_io"] == "not-allowlisted"
    assert st["cpu"] == "loaded"  # built-ins always load
    assert "fixture_hello" in host.registry("endpoints")
    assert "recorder_attn" in host.registry("attention_backends")


def test_allowlist_matches_distribution_name(fixture_sites):
    host = load([fixture_sites["recorder"]], PluginSettings(allow=("host-fixture-recorder",)))
    assert {n: s for n, s in statuses(host).items() if n.startswith("recorder_")} == {
        n: "loaded" for n in (
            "recorder_general", "recorder_platform", "recorder_attention", "recorder_quant",
            "recorder_kv", "recorder_executor", "recorder_io", "recorder_stats", "recorder_tool_parsers",
            "recorder_reasoning_parsers", "recorder_models",
        )
    }


def test_empty_allowlist_loads_no_third_party(fixture_sites):
    sites = [fixture_sites["recorder"], fixture_sites["endpoint"], fixture_sites["broken"]]
    host = load(sites, PluginSettings(allow=()))
    st = statuses(host)
    assert all(s == "not-allowlisted" for n, s in st.items() if n.startswith(("recorder_", "fixture_")))
    assert st["cpu"] == "loaded"
    assert "recorder_quant" not in host.registry("quantization_methods")


def test_unknown_allowlisted_name_is_an_error(fixture_sites):
    with on_sys_path(fixture_sites["recorder"]):
        host = PluginHost(PluginSettings(allow=("recorder_general", "no_such_plugin")))
        with pytest.raises(PluginConfigError) as err:
            host.bootstrap("engine")
    msg = str(err.value)
    assert "'no_such_plugin'" in msg and "match no installed plugin" in msg
    assert "recorder_general" in msg  # lists what is installed
    assert isinstance(err.value, ValueError)


def test_blocklist_blocks_third_party_and_builtins(fixture_sites):
    host = load([fixture_sites["recorder"]], PluginSettings(block=("recorder_io", "cuda")))
    st = statuses(host)
    assert st["recorder_io"] == "blocked"
    assert st["cuda"] == "blocked"
    assert st["recorder_stats"] == "loaded"
    assert "host_fixture_recorder.io_processors" not in __import__("sys").modules
    assert "cuda" not in host.registry("platforms")
    assert host.pm.is_blocked("host.platforms:cuda")


def test_broken_plugin_is_recorded_not_fatal_by_default(fixture_sites, caplog):
    sites = [fixture_sites["broken"], fixture_sites["recorder"]]
    with caplog.at_level(logging.WARNING, logger="host.plugins"):
        host = load(sites, PluginSettings(), raise_on_fatal=True)
    rec = {r.name: r for r in host.list_records()}["fixture_broken"]
    assert rec.status == "failed"
    assert "RuntimeError: fixture plugin is broken on purpose" in rec.reason
    assert rec.distribution == "host-fixture-broken" and rec.version == "1.0.0"
    assert any("fixture_broken" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    # the others still loaded
    assert statuses(host)["recorder_general"] == "loaded"


def test_broken_plugin_is_fatal_when_strict(fixture_sites):
    with on_sys_path(fixture_sites["broken"]):
        host = PluginHost(PluginSettings(strict=True))
        with pytest.raises(PluginError, match="fixture_broken.*broken on purpose"):
            host.bootstrap("engine")


def test_broken_plugin_is_fatal_when_allowlisted(fixture_sites):
    with on_sys_path(fixture_sites["broken"]):
        host = PluginHost(PluginSettings(allow=("fixture_broken",)))
        with pytest.raises(PluginError, match="named in --plugins"):
            host.bootstrap("worker")


def test_hook_outside_group_is_rejected(fixture_sites):
    host = load([fixture_sites["wronggroup"]], PluginSettings())
    rec = {r.name: r for r in host.list_records()}["fixture_wronggroup"]
    assert rec.status == "failed"
    assert "host_fixture_wronggroup" in rec.reason
    assert "host_register_attention_backends" in rec.reason
    assert "host.io_processors" in rec.reason and "host.attention_backends" in rec.reason
    # unregistered: its hook is never called
    assert host.registry("attention_backends") is not None
    with on_sys_path(fixture_sites["wronggroup"]):
        strict = PluginHost(PluginSettings(strict=True))
        with pytest.raises(PluginError, match="host_register_attention_backends"):
            strict.bootstrap("api")


def test_exception_inside_a_hook_is_recorded(plugin_host, register_plugin):
    class Exploding:
        from host.sdk import hookimpl

        @hookimpl
        def host_register_stat_loggers(self, register):
            raise KeyError("boom")

    register_plugin(Exploding(), name="exploding", group="host.stat_loggers")
    with pytest.raises(PluginError, match="hook host_register_stat_loggers raised KeyError"):
        # in-memory plugins count as explicitly chosen, so their failure is fatal
        plugin_host.registry("stat_loggers")
    rec = plugin_host.records["host.stat_loggers:exploding"]
    assert rec.status == "failed"


def test_duplicate_registry_name_names_both_plugins(plugin_host, register_plugin):
    from host.sdk import QuantizationMethod, hookimpl

    class Q(QuantizationMethod):
        name = "int4x"

    class One:
        @hookimpl
        def host_register_quantization_methods(self, register):
            register(Q)

    class Two:
        @hookimpl
        def host_register_quantization_methods(self, register):
            register(Q)

    register_plugin(One(), name="one", group="host.quantization")
    register_plugin(Two(), name="two", group="host.quantization")
    with pytest.raises(PluginError) as err:
        plugin_host.registry("quantization_methods")
    assert "int4x" in str(err.value) and "one" in str(err.value) and "two" in str(err.value)


def test_groups_load_once_and_failures_are_not_retried(fixture_sites):
    with on_sys_path(fixture_sites["recorder"], fixture_sites["broken"]):
        host = PluginHost(PluginSettings())
        host.bootstrap("engine")
        import host_fixture_recorder.general as general

        host.bootstrap("engine")  # idempotent: no second startup call
        assert general.CALLS == ["engine"]
        first = host.records["host.general:fixture_broken"]
        host.load_groups(["host.general"])
        assert host.records["host.general:fixture_broken"] is first  # not retried
        host.bootstrap("worker")  # in-process use: a second role runs startup for that role
        assert general.CALLS == ["engine", "worker"]
