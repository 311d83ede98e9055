"""Starting host's own child processes (engine core, workers) so that each one bootstraps its
plugin groups before doing anything else, with the parent's plugin settings."""

from __future__ import annotations

import multiprocessing
import os
from typing import Any, Callable

from host.core.plugins.manager import bootstrap_process, get_plugin_host
from host.core.plugins.settings import PluginSettings


def _child_main(process: str, settings: PluginSettings, target: Callable[..., Any], args: tuple) -> None:
    from host.core.logging_config import configure_logging

    configure_logging()
    os.environ.update(settings.to_env())
    bootstrap_process(process, settings)
    target(*args)


def spawn_process(process: str, target: Callable[..., Any], *args: Any, name: str | None = None) -> multiprocessing.Process:
    """Start ``target(*args)`` in a fresh (spawned) process that first bootstraps ``process``
    (``"engine"`` or ``"worker"``) with this process's plugin settings. Returns it started."""
    ctx = multiprocessing.get_context("spawn")
    settings = get_plugin_host().settings
    proc = ctx.Process(target=_child_main, args=(process, settings, target, args), name=name or f"host-{process}", daemon=True)
    proc.start()
    return proc
