"""The admin CLI, run as the installed ``host`` command in child processes: the module's 16
commands start in one pool of four, in the order of the tests that read them, so both cores stay
busy across tests (each test waits for its own commands)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import run_host

THIRD_PARTY = ("recorder", "endpoint", "broken", "wronggroup")
TRACE = {"HOST_TRACE_PLUGINS": "1"}


@pytest.fixture(scope="module")
def runs(fixture_sites):
    """``{name: Future}`` of every command of the module, each ``(args, fixture packages, env)``."""
    calls = {
        "help": (["--help"], (), {}),
        "plugins_help": (["plugins", "--help"], (), {}),
        "listed": (["plugins", "list", "--json"], THIRD_PARTY, {}),
        "blocked": (["plugins", "list", "--json", "--block-plugins", "recorder_io"], THIRD_PARTY, {}),
        "table": (["plugins", "list"], THIRD_PARTY, {}),
        "only": (["plugins", "list", "--json", "--group", "host.attention_backends"], ("recorder",), {}),
        "api": (["plugins", "list", "--json", "--process", "api"], ("recorder",), {}),
        "worker": (["plugins", "list", "--json", "--process", "worker"], ("recorder",), {}),
        "bad_process": (["plugins", "list", "--process", "gpu"], ("recorder",), {}),
        "all": (["plugins", "list", "--json", "--all"], (), {}),
        "check": (["plugins", "check"], ("recorder", "broken"), {}),
        "check_allowlisted": (["plugins", "check", "--plugins", "fixture_broken,recorder_io"], ("recorder", "broken"), {}),
        "check_unknown": (["plugins", "check"], ("recorder", "broken"), {"HOST_PLUGINS": "recorder_io,typo_plugin"}),
        "check_strict": (["plugins", "check", "--strict-plugins"], ("recorder", "broken"), {}),
        "trace": (["plugins", "list", "--json"], ("recorder",), TRACE),
        "quiet": (["plugins", "list", "--json"], ("recorder",), {}),
    }
    with ThreadPoolExecutor(4) as pool:
        futures = {name: pool.submit(run_host, args, [fixture_sites[n] for n in names], 300, **env)
                   for name, (args, names, env) in calls.items()}
        yield futures
        for future in futures.values():  # a command no test read is not left running
            future.cancel()


def results(runs, *names):
    return [runs[name].result() for name in names]


def as_json(proc):
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_help_lists_every_command(runs):
    proc, sub = results(runs, "help", "plugins_help")
    assert proc.returncode == 0
    for command in ("plugins", "platform", "version"):
        assert command in proc.stdout
    assert "list" in sub.stdout and "check" in sub.stdout


def test_list_json_shows_builtins_with_groups_and_processes(builtin_plugins_listing):
    data = as_json(builtin_plugins_listing)  # the session's run of the same command
    rows = {(r["group"], r["name"]): r for r in data["plugins"]}
    cpu = rows[("host.platforms", "cpu")]
    assert cpu["source"] == "builtin" and cpu["distribution"] == "host"
    assert cpu["processes"] == ["api", "engine", "worker"]
    assert cpu["status"] == "loaded" and cpu["hooks"] == ["host_offer_kernels", "host_register_platforms"]  # + its kernels
    assert ("host.platforms", "cuda") in rows and ("host.platforms", "rocm") in rows
    assert rows[("host.executors", "uniproc")]["processes"] == ["engine"]
    assert rows[("host.endpoints", "builtin_endpoints")]["processes"] == ["api"]
    from host.plugins.builtin_models import ARCHITECTURES, EPLB_POLICIES

    assert sorted(rows[("host.models", "builtin_models")]["registered"]) == sorted(
        [f"models:{arch}" for arch in ARCHITECTURES] + [f"eplb_policies:{name}" for name in EPLB_POLICIES]
    )
    assert "models:LlamaForCausalLM" in rows[("host.models", "builtin_models")]["registered"]


def test_list_shows_third_party_status_and_reasons(runs):
    listed, blocked, table = results(runs, "listed", "blocked", "table")
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


def test_list_filters_by_group_and_process(runs):
    only, api, worker, bad = results(runs, "only", "api", "worker", "bad_process")
    assert {r["group"] for r in as_json(only)["plugins"]} == {"host.attention_backends"}
    groups = {r["group"] for r in as_json(api)["plugins"]}
    assert "host.executors" not in groups and "host.io_processors" in groups
    assert "host.executors" not in {r["group"] for r in as_json(worker)["plugins"]}
    assert bad.returncode != 0 and "unknown process" in bad.stderr


def test_list_all_includes_groups(runs):
    data = as_json(runs["all"].result())
    assert data["groups"]["host.endpoints"]["processes"] == ["api"]
    assert data["groups"]["host.platforms"]["lazy_in"] == ["api"]


def test_check_exit_codes(runs):
    ok, allowlisted, unknown, strict = results(runs, "check", "check_allowlisted", "check_unknown", "check_strict")
    assert ok.returncode == 0, ok.stderr
    assert "warning: fixture_broken" in ok.stderr  # reported, but not allowlisted
    assert allowlisted.returncode == 1
    assert "fixture_broken" in allowlisted.stderr and "broken on purpose" in allowlisted.stderr
    assert unknown.returncode == 1 and "'typo_plugin'" in unknown.stderr
    assert strict.returncode == 1


def test_trace_env_logs_hook_calls(runs):
    proc, quiet = results(runs, "trace", "quiet")
    assert proc.returncode == 0
    assert "[host trace" in proc.stderr
    assert "host_register_platforms" in proc.stderr
    assert "host.platforms:recorder_platform" in proc.stderr
    assert "[host trace" not in quiet.stderr
