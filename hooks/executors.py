"""Hooks of the ``host.executors`` family: how the engine drives its workers.

Loaded in the engine process only.
"""

from __future__ import annotations

from typing import Callable

from host.hooks.markers import hookspec

# this family's entry-point group and where it loads (gathered by host.hooks.groups)
GROUP = "host.executors"
LOADED_IN = ("engine",)
LAZY_IN: tuple[str, ...] = ()
SUMMARY = "executors"


@hookspec
def host_register_executors(register: Callable[..., None]) -> None:
    """Offer :class:`host.sdk.Executor` subclasses.

    Call ``register(executor_class)``; ``--distributed-executor-backend NAME`` selects one by its
    ``name`` (``uniproc`` when there is one worker).
    """
