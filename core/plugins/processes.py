"""Starting host's own child processes (engine core, workers) so that each one bootstraps its
plugin groups before doing anything else, with the parent's plugin settings — and dies with its
parent.

A child must not outlive the process that started it (an orphaned engine keeps its device
memory and its model forever). Two mechanisms, set up first thing in the child:

- on Linux, ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: the kernel kills the child when the parent
  thread that spawned it exits. It is only asked for when the parent spawned from its main
  thread (the death signal follows the *thread*, so a child spawned from a short-lived thread
  would die with that thread). The parent may already be gone before ``prctl`` runs: the child
  then compares ``getppid()`` with the pid it was given and exits at once.
- everywhere, a death pipe: the parent keeps the write end (on the returned process object) and
  never writes; a daemon thread in the child blocks on the read end and exits the process when
  it reads end-of-file, i.e. when every copy of the write end is closed (the parent died, or
  dropped the process object).

A grandchild (a worker started by the engine) is covered the same way by its own parent, so a
``SIGKILL`` of the API process takes the whole tree down.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import multiprocessing
import os
import signal
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any, Callable

from host.core.plugins.manager import bootstrap_process, get_plugin_host
from host.core.plugins.settings import PluginSettings

logger = logging.getLogger("host.processes")

_PR_SET_PDEATHSIG = 1
_EXIT_PARENT_GONE = 70


def _set_parent_death_signal(sig: int) -> bool:
    """Ask the Linux kernel to send ``sig`` to this process when its parent exits; ``False``
    where that is not available (not Linux, no libc, the call failed)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _parent_gone(why: str) -> None:
    print(f"host: {why}; this child process (pid {os.getpid()}) exits with it", file=sys.stderr, flush=True)
    os._exit(_EXIT_PARENT_GONE)


def _watch_death_pipe(conn: Connection, parent_pid: int) -> None:
    try:
        conn.recv_bytes()  # the parent never writes: this returns only by EOF
    except (EOFError, OSError):
        pass
    _parent_gone(f"the parent process {parent_pid} is gone")


def die_with_parent(parent_pid: int, death_pipe: Connection | None, use_pdeathsig: bool) -> None:
    """Make this (child) process exit when ``parent_pid`` does (see the module docstring).
    Exits at once when the parent is already gone."""
    if use_pdeathsig and _set_parent_death_signal(signal.SIGKILL) and os.getppid() != parent_pid:
        _parent_gone(f"the parent process {parent_pid} died before this child was set up")
    if death_pipe is not None:
        threading.Thread(target=_watch_death_pipe, args=(death_pipe, parent_pid), name="host-parent-watch", daemon=True).start()


def _child_main(
    process: str,
    settings: PluginSettings,
    target: Callable[..., Any],
    args: tuple,
    parent_pid: int | None = None,
    death_pipe: Connection | None = None,
    use_pdeathsig: bool = True,
) -> None:
    if parent_pid is not None:
        die_with_parent(parent_pid, death_pipe, use_pdeathsig)
    from host.core.logging_config import configure_logging

    configure_logging()
    os.environ.update(settings.to_env())
    bootstrap_process(process, settings)
    target(*args)


def spawn_process(process: str, target: Callable[..., Any], *args: Any, name: str | None = None) -> multiprocessing.Process:
    """Start ``target(*args)`` in a fresh (spawned) process that first bootstraps ``process``
    (``"engine"`` or ``"worker"``) with this process's plugin settings, and that exits when
    this process does. Returns it started; it holds the write end of the child's death pipe,
    so keep it for as long as the child should live."""
    ctx = multiprocessing.get_context("spawn")
    settings = get_plugin_host().settings
    reader, writer = ctx.Pipe(duplex=False)
    use_pdeathsig = threading.current_thread() is threading.main_thread()
    proc = ctx.Process(
        target=_child_main,
        args=(process, settings, target, args, os.getpid(), reader, use_pdeathsig),
        name=name or f"host-{process}",
        daemon=True,
    )
    me = multiprocessing.current_process()
    if me.daemon:
        # a host child starting children of its own (the engine its workers): multiprocessing
        # refuses that to a daemon, but these die with their parent anyway (death pipe and
        # parent-death signal, above), which is what the refusal guards
        me._config["daemon"] = False  # type: ignore[attr-defined]
    proc.start()
    reader.close()
    proc._host_death_pipe = writer  # type: ignore[attr-defined]  # closed with the process object
    return proc
