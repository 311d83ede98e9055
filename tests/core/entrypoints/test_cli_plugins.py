"""The admin CLI, run as the installed ``host`` command in child processes (a test's independent
commands run side by side: helpers.run_hosts)."""

from __future__ import annotations

import json

from helpers import run_host, run_hosts


def plugins_json(sites, *args, **env):
    return as_json(run_host(["plugins", "list", "--json", *args], sites, **env))


def as_json(proc):
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_help_lists_every_command():
    proc, sub = run_hosts((["--help"], []), (["plugins", "--help"], []))
    assert proc.returncode == 0
    for command in ("plugins", "platform", "version"):
        assert command in proc.stdout
    assert "list" in sub.stdout and "check" in sub.stdout


def test_list_json_shows_builtins_with_groups_and_processes():
    data = plugins_json([])
    rows = {(r["group"], r["name"]): r for r in data["plugins"]}
    cpu = rows[("host.platforms", "cpu")]
    assert cpu["source"] == "builtin" and cpu["distribution"] == "host"
    assert cpu["processes"] == ["api", "engine", "worker"]
    assert cpu["status"] == "loaded" and cpu["hooks"] == ["host_register_platforms"]
    assert ("host.platforms", "cuda") in rows and ("host.platforms", "rocm") in rows
    assert rows[("host.executors", "uniproc")]["processes"] == ["engine"]
    assert rows[("host.endpoints", "builtin_endpoints")]["processes"] == ["api"]
    from host.plugins.builtin_models import ARCHITECTURES

    assert rows[("host.general", "builtin_models")]["registered"] == [f"models:{arch}" for arch in ARCHITECTURES]
    assert "models:LlamaForCausalLM" in rows[("host.general", "builtin_models")]["registered"]


def test_list_shows_third_party_status_and_reasons(fixture_sites):
    sites = [fixture_sites[n] for n in ("recorder", "endpoint", "broken", "wronggroup")]
    listed, blocked, table = run_hosts(
        (["plugins", "list", "--json"], sites), (["plugins", "list", "--json", "--block-plugins", "recorder_io"], sites),
        (["plugins", "list"], sites),
    )
    rows = {r["name"]: r for r in as_json(listed)["plugins"]}
    assert rows["recorder_attention"]["status"] == "loaded"
    assert rows["recorder_attention"]["source"] == "third-party"
    assert rows["recorder_attention"]["distribution"] == "host-fixture-recorder"
    assert rows["recorder_attention"]["version"] == "1.0.0"
    assert rows["recorder_attention"]["processes"] == ["engine", "worker"]
    assert rows["fixture_hello"]["status"] == "not-allowlisted"
    assert "--plugins fixture_hello" in rows["fixture_hello"]["reason"]
    assert rows["fixture_broken"]["status"] == "failed"
    assert "broken on purpose" in rows["fixture_broken"]["reason"]
    assert rows["fixture_wronggroup"]["status"] == "failed"
    assert {r["name"]: r for r in as_json(blocked)["plugins"]}["recorder_io"]["status"] == "blocked"
    # the table form shows the same facts to a person
    assert "fixture_broken" in table.stdout and "failed" in table.stdout


def test_list_filters_by_group_and_process(fixture_sites):
    sites = [fixture_sites["recorder"]]
    only, api, worker, bad = run_hosts(
        (["plugins", "list", "--json", "--group", "host.attention_backends"], sites),
        (["plugins", "list", "--json", "--process", "api"], sites),
        (["plugins", "list", "--json", "--process", "worker"], sites),
        (["plugins", "list", "--process", "gpu"], sites),
    )
    assert {r["group"] for r in as_json(only)["plugins"]} == {"host.attention_backends"}
    groups = {r["group"] for r in as_json(api)["plugins"]}
    assert "host.executors" not in groups and "host.io_processors" in groups
    assert "host.executors" not in {r["group"] for r in as_json(worker)["plugins"]}
    assert bad.returncode != 0 and "unknown process" in bad.stderr


def test_list_all_includes_groups():
    data = plugins_json([], "--all")
    assert data["groups"]["host.endpoints"]["processes"] == ["api"]
    assert data["groups"]["host.platforms"]["lazy_in"] == ["api"]


def test_check_exit_codes(fixture_sites):
    sites = [fixture_sites["recorder"], fixture_sites["broken"]]
    ok, allowlisted, unknown, strict = run_hosts(
        (["plugins", "check"], sites), (["plugins", "check", "--plugins", "fixture_broken,recorder_io"], sites),
        (["plugins", "check"], sites, {"HOST_PLUGINS": "recorder_io,typo_plugin"}), (["plugins", "check", "--strict-plugins"], sites),
    )
    assert ok.returncode == 0, ok.stderr
    assert "warning: fixture_broken" in ok.stderr  # reported, but not allowlisted
    assert allowlisted.returncode == 1
    assert "fixture_broken" in allowlisted.stderr and "broken on purpose" in allowlisted.stderr
    assert unknown.returncode == 1 and "'typo_plugin'" in unknown.stderr
    assert strict.returncode == 1


def test_trace_env_logs_hook_calls(fixture_sites):
    sites = [fixture_sites["recorder"]]
    proc, quiet = run_hosts((["plugins", "list", "--json"], sites, {"HOST_TRACE_PLUGINS": "1"}), (["plugins", "list", "--json"], sites))
    assert proc.returncode == 0
    assert "[host trace" in proc.stderr
    assert "host_register_platforms" in proc.stderr
    assert "host.platforms:recorder_platform" in proc.stderr
    assert "[host trace" not in quiet.stderr
