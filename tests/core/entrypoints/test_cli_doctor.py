"""``host doctor``, run as the installed command: every section, the JSON form, the two-rank gloo
all-reduce really running, and real failures (a taken port, a forced platform that does not
exist, a gloo interface that does not exist) reported with their fix."""

from __future__ import annotations

import json
import re
import socket

import typer

from helpers import REPO, free_port, run_host
from host.core.entrypoints.cli.doctor_cmd import SECTIONS
from host.core.entrypoints.cli.main import app


def doctor_json(*args, **env):
    proc = run_host(["doctor", "--json", *args], [], timeout=180, **env)
    return proc, json.loads(proc.stdout)


def by_name(data):
    return {c["name"]: c for c in data["checks"]}


def test_doctor_prints_every_section_and_exits_0():
    proc = run_host(["doctor"], [], timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for section in SECTIONS:
        assert f"== {section} ==" in proc.stdout
    for name in ("packages:", "cpu flags:", "resolution: cpu", "gloo all-reduce: 2 ranks all-reduced to 3",
                 "shared memory:", "port 8000:"):
        assert name in proc.stdout
    assert "torch 2." in proc.stdout and "msgspec" in proc.stdout and "AMX:" in proc.stdout
    assert proc.stdout.rstrip().splitlines()[-1].startswith("doctor: ok (")


def test_doctor_json_shows_the_gloo_all_reduce_ran_on_two_ranks():
    proc, data = doctor_json()
    assert proc.returncode == 0 and data["ok"] is True, proc.stdout
    assert {c["section"] for c in data["checks"]} == set(SECTIONS)
    assert data["summary"]["fail"] == 0
    assert sum(data["summary"].values()) == len(data["checks"])
    checks = by_name(data)
    gloo = checks["gloo all-reduce"]
    assert gloo["status"] == "ok"
    assert gloo["data"]["world_size"] == 2 and gloo["data"]["expected_sum"] == 3.0
    assert gloo["data"]["ranks"] == [{"rank": 0, "sum": 3.0}, {"rank": 1, "sum": 3.0}]
    assert checks["nccl all-reduce"]["status"] in ("ok", "skip")  # skipped here with its reason
    assert checks["nccl all-reduce"]["detail"]
    assert checks["resolution"]["data"]["platform"]["name"] == "cpu"
    assert "torch" in checks["packages"]["data"]["packages"]
    flags = checks["cpu flags"]["data"]
    assert set(flags) >= {"listed", "torch_capability", "amx_cpu", "amx_executes"}
    for c in data["checks"]:
        assert c["status"] in ("ok", "warn", "fail", "skip")
        assert (c["status"] in ("warn", "fail")) == bool(c["fix"]), c


def test_a_taken_port_low_shm_and_leftover_debug_settings_warn_with_their_fix():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        free = free_port()
        proc, data = doctor_json(
            "--no-distributed", "--port", str(port), "--port", str(free), "--min-shm-gib", "1e9",
            HOST_LOG_LEVEL="DEBUG", HOST_API_KEY="sekret-key",
        )
    assert proc.returncode == 0, proc.stdout  # warnings do not fail the run
    checks = by_name(data)
    busy = checks[f"port {port}"]
    assert busy["status"] == "warn" and busy["data"]["free"] is False
    assert "host serve --port " in busy["fix"]
    assert checks[f"port {free}"]["status"] == "ok"
    shm = checks["shared memory"]
    assert shm["status"] == "warn" and "docker run --shm-size=" in shm["fix"]
    env = checks["variables"]
    assert env["status"] == "warn" and "unset HOST_LOG_LEVEL" in env["fix"]
    assert "sekret-key" not in proc.stdout  # the API key is named, never printed
    assert env["data"]["env"]["HOST_API_KEY"] == "<set>"


def test_a_failing_check_exits_1_with_its_fix():
    proc = run_host(["doctor", "--platform", "nonexistent", "--no-distributed"], [], timeout=180)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "[FAIL] resolution: --platform / HOST_PLATFORM='nonexistent' matches no registered platform" in proc.stdout
    assert "fix: pass --platform with one of the registered names" in proc.stdout
    assert "== ports ==" in proc.stdout  # the other checks still ran
    assert proc.stdout.rstrip().splitlines()[-1].startswith("doctor: FAIL (")


def test_a_gloo_rendezvous_that_cannot_work_fails_the_distributed_check():
    proc, data = doctor_json(GLOO_SOCKET_IFNAME="nosuchif0")
    assert proc.returncode == 1 and data["ok"] is False
    gloo = by_name(data)["gloo all-reduce"]
    assert gloo["status"] == "fail"
    assert "nosuchif0" in gloo["detail"] and "GLOO_SOCKET_IFNAME" in gloo["fix"]
    assert [r["rank"] for r in gloo["data"]["ranks"]] == [0, 1]


DOCKER_FLAGS = {"--shm-size", "--ipc"}  # `docker run`'s, named in the fixes


def test_docs_operations_names_only_flags_that_exist():
    options: set[str] = set()
    stack = [typer.main.get_command(app)]
    while stack:
        command = stack.pop()
        stack.extend(getattr(command, "commands", {}).values())
        options |= {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    text = (REPO / "docs" / "operations.md").read_text()
    mentioned = {m.replace("[no-]", "") for m in re.findall(r"(?<![\w-])--(?:\[no-\])?[a-z][a-z-]*[a-z]", text)}
    assert sorted(mentioned - options - DOCKER_FLAGS) == [], "docs/operations.md names flags no host command has"
