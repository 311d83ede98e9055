"""A child started with ``spawn_process`` dies with its parent: by the Linux parent-death signal
when the parent spawned it from its main thread, by the death pipe otherwise (a child spawned
from another thread must not die with that thread)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

SCRIPT = textwrap.dedent(
    """
    import sys, threading, time
    from host.core.plugins.processes import spawn_process

    procs = []

    def start():
        procs.append(spawn_process("worker", time.sleep, 600, name="host-test-child"))

    if sys.argv[1] == "thread":
        t = threading.Thread(target=start)
        t.start()
        t.join()  # the spawning thread is gone: the child must live on
    else:
        start()
    print(procs[0].pid, flush=True)
    time.sleep(600)
    """
)


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("spawned_from", ["main", "thread"])
def test_child_dies_when_its_parent_is_killed(spawned_from):
    parent = subprocess.Popen([sys.executable, "-c", SCRIPT, spawned_from], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        time.sleep(1.0)
        assert _alive(child), "the child died while its parent still runs"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), f"the child {child} outlived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
