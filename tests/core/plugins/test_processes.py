"""Each process loads only its own groups, once. Proven with real processes: an API process
(the parent) that spawns an engine process and a worker process the way the engine does, with a
pip-installed fixture that records (pid, process, group) from every group's startup hook."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from helpers import subprocess_env
from host.hooks.groups import GROUPS, groups_for

SCRIPT = textwrap.dedent(
    """
    import os, sys
    from host.core.plugins import bootstrap_process
    from host.core.plugins.processes import spawn_process

    def noop():
        pass

    if __name__ == "__main__":
        bootstrap_process("api")
        bootstrap_process("api")  # idempotent: startup hooks must not run twice
        for role in ("engine", "worker"):
            p = spawn_process(role, noop)
            p.join(60)
            assert p.exitcode == 0, (role, p.exitcode)
        # the API process loads platforms lazily, on first use
        from host.core.plugins.platform import current_platform
        print("platform", current_platform().name)
        print("pid", os.getpid())
    """
)


def test_each_process_loads_its_groups_once(fixture_sites, tmp_path):
    record = tmp_path / "record.jsonl"
    script = tmp_path / "topology.py"
    script.write_text(SCRIPT)
    env = subprocess_env([fixture_sites["recorder"]], HOST_FIXTURE_RECORD=str(record))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr
    api_pid = int(proc.stdout.split("pid")[-1].strip())
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    by_process: dict[str, list[dict]] = {}
    for row in rows:
        by_process.setdefault(row["process"], []).append(row)
    assert set(by_process) == {"api", "engine", "worker"}
    # three distinct OS processes
    pids = {p: {r["pid"] for r in rs} for p, rs in by_process.items()}
    assert all(len(v) == 1 for v in pids.values())
    assert pids["api"] == {api_pid}
    assert len({next(iter(v)) for v in pids.values()}) == 3
    for process, rs in by_process.items():
        groups = [r["group"] for r in rs]
        assert len(groups) == len(set(groups)), f"{process} ran a startup hook twice: {groups}"
        recorder_groups = set(GROUPS) - {"host.endpoints"}  # the recorder has no endpoint plugin
        expected = set(groups_for(process)) & recorder_groups
        if process == "api":  # lazy there, and nothing here asks for it (--quantization NAME or host platform do)
            expected.discard("host.quantization")
        expected.discard("host.models")  # lazy in every process, and no model is resolved here
        assert set(groups) == expected, (process, sorted(groups), sorted(expected))
    # the API process loads host.platforms lazily: its startup record comes after the children's
    api_rows = [r["group"] for r in by_process["api"]]
    assert api_rows[-1] == "host.platforms"
    first_child = min(i for i, r in enumerate(rows) if r["process"] != "api")
    assert rows.index({"pid": api_pid, "process": "api", "group": "host.platforms"}) > first_child
    assert "host.executors" not in {r["group"] for r in by_process["worker"]}
    assert "host.attention_backends" not in {r["group"] for r in by_process["api"]}
    assert "host.io_processors" not in {r["group"] for r in by_process["engine"]}
    assert "platform cpu" in proc.stdout
