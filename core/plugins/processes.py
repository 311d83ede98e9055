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
import importlib
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


def _child_setup(process: str, settings: PluginSettings, parent_pid: int | None, death_pipe: Connection | None,
                 use_pdeathsig: bool) -> None:
    if parent_pid is not None:
        die_with_parent(parent_pid, death_pipe, use_pdeathsig)
    from host.core.logging_config import configure_logging

    configure_logging()
    os.environ.update(settings.to_env())
    bootstrap_process(process, settings)


def _child_main(
    process: str,
    settings: PluginSettings,
    target: Callable[..., Any],
    args: tuple,
    parent_pid: int | None = None,
    death_pipe: Connection | None = None,
    use_pdeathsig: bool = True,
) -> None:
    _child_setup(process, settings, parent_pid, death_pipe, use_pdeathsig)
    target(*args)


def _early_child_main(
    process: str,
    settings: PluginSettings,
    target: Callable[..., Any],
    preload: tuple[str, ...],
    args_pipe: Connection,
    parent_pid: int,
    death_pipe: Connection,
    use_pdeathsig: bool,
) -> None:
    _child_setup(process, settings, parent_pid, death_pipe, use_pdeathsig)
    for module in preload:  # the imports the target will need, while the parent still prepares its arguments
        importlib.import_module(module)
    try:
        args = args_pipe.recv()
    except EOFError:  # the parent dropped this process before starting it
        return
    finally:
        args_pipe.close()
    if args is not None:
        target(*args)


class EarlyProcess:
    """A child spawned before its arguments are known (see :func:`spawn_early`): it bootstraps its
    plugin groups and imports its modules while the parent goes on. :meth:`start` hands it the
    arguments (once); :meth:`cancel` lets it exit without running its target."""

    def __init__(self, process: multiprocessing.Process, args_pipe: Connection) -> None:
        self.process = process
        self._args_pipe: Connection | None = args_pipe

    def start(self, *args: Any) -> multiprocessing.Process:
        """Run ``target(*args)`` in the child; returns the process (a child that died in its
        start-up is returned as it is: the caller's liveness checks report its exit code)."""
        if self._args_pipe is None:
            raise RuntimeError("this early process was already started or cancelled")
        pipe, self._args_pipe = self._args_pipe, None
        try:
            pipe.send(args)
        except OSError:  # the child is gone
            pass
        finally:
            pipe.close()
        return self.process

    def cancel(self, timeout: float = 5.0) -> None:
        """Tell an unstarted child to exit and wait for it (killed after ``timeout`` seconds)."""
        if self._args_pipe is None:
            return
        pipe, self._args_pipe = self._args_pipe, None
        try:
            pipe.send(None)
        except OSError:  # the child is already gone
            pass
        pipe.close()
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)


def spawn_early(process: str, target: Callable[..., Any], preload: tuple[str, ...] = (), name: str | None = None) -> EarlyProcess:
    """Spawn the child that :func:`spawn_process` would, before ``target``'s arguments exist: it
    bootstraps ``process`` with this process's plugin settings and imports ``preload`` at once,
    then waits for :meth:`EarlyProcess.start`. A parent that needs a few seconds to compute the
    arguments (the engine configuration) overlaps the child's start-up (interpreter, torch,
    plugins) with that work. The child dies with this process as :func:`spawn_process`'s do; its
    environment is this process's at the time of this call."""
    args_reader, args_writer = multiprocessing.get_context("spawn").Pipe(duplex=False)
    proc = _start_child(_early_child_main, (process, get_plugin_host().settings, target, tuple(preload), args_reader),
                        name or f"host-{process}")
    args_reader.close()
    return EarlyProcess(proc, args_writer)


def _start_child(main: Callable[..., Any], args: tuple, name: str) -> multiprocessing.Process:
    """Start ``main(*args, parent_pid, death_pipe, use_pdeathsig)`` in a spawned daemon process."""
    ctx = multiprocessing.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    use_pdeathsig = threading.current_thread() is threading.main_thread()
    proc = ctx.Process(target=main, args=(*args, os.getpid(), reader, use_pdeathsig), name=name, daemon=True)
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


def spawn_process(process: str, target: Callable[..., Any], *args: Any, name: str | None = None) -> multiprocessing.Process:
    """Start ``target(*args)`` in a fresh (spawned) process that first bootstraps ``process``
    (``"engine"`` or ``"worker"``) with this process's plugin settings, and that exits when
    this process does. Returns it started; it holds the write end of the child's death pipe,
    so keep it for as long as the child should live."""
    return _start_child(_child_main, (process, get_plugin_host().settings, target, args), name or f"host-{process}")
