"""spawn_early: a child spawned before its arguments exist bootstraps and preloads at once, runs its
target once handed the arguments, and a cancelled one exits without running it. Real spawned
processes, driven from a script (spawn targets must live in an importable ``__main__``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from helpers import subprocess_env

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from host.core.plugins import bootstrap_process
    from host.core.plugins.processes import spawn_early

    def report(path, word):
        # written by the target: what the child had done before it ran
        from host.core.plugins.manager import get_plugin_host
        with open(path, "w") as f:
            json.dump({"pid": os.getpid(), "word": word, "preloaded": "host.core.engine.core" in sys.modules,
                       "roles": list(get_plugin_host().roles)}, f)

    if __name__ == "__main__":
        out = sys.argv[1]
        bootstrap_process("api")
        early = spawn_early("engine", report, preload=("host.core.engine.core",))
        proc = early.start(out + "/ran.json", "hello")
        proc.join(120)
        assert proc.exitcode == 0, proc.exitcode
        try:
            early.start(out + "/twice.json", "again")
        except RuntimeError as exc:
            print("second start:", exc)
        cancelled = spawn_early("engine", report)
        cancelled.cancel()
        print("cancelled exit code", cancelled.process.exitcode, "alive", cancelled.process.is_alive())
        cancelled.cancel()  # a second cancel is a no-op
        print("parent", os.getpid())
    """
)


def test_an_early_process_runs_its_target_once_and_a_cancelled_one_never(tmp_path):
    script = tmp_path / "early.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True,
                          env=subprocess_env([]), timeout=240)
    assert proc.returncode == 0, proc.stderr
    import json

    ran = json.loads((tmp_path / "ran.json").read_text())
    parent = int(proc.stdout.split("parent")[-1].strip())
    assert ran["word"] == "hello" and ran["pid"] != parent
    assert ran["preloaded"], "the preload modules were not imported before the target ran"
    assert "engine" in ran["roles"], ran
    assert "second start: this early process was already started or cancelled" in proc.stdout
    assert not (tmp_path / "twice.json").exists()
    assert "cancelled exit code 0 alive False" in proc.stdout
