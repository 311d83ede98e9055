"""Small helpers shared across the core."""

from __future__ import annotations

import atexit
import gc
import importlib
from typing import Any

_unfreeze_at_exit = False  # freeze_startup_objects registered its atexit hook


def freeze_startup_objects() -> None:
    """Collect once, then move every object alive now to the permanent generation (``gc.freeze``).

    torch, transformers and the plugins leave about 300,000 long-lived objects behind, and a full
    (generation 2) collection walks them all: 225 ms measured in an engine process holding the
    default model, a stall of every running request whenever one falls due. Frozen, they are never
    walked again (the same collection then takes microseconds). Called once a process has started
    up (the API server, the engine core, each worker process); objects made later are collected
    as usual.

    At exit the objects are unfrozen again (an ``atexit`` hook), so the interpreter's last
    collection frees the reference cycles among them before the extension modules go: a frozen
    cycle holding triton's nanobind objects (torch imports triton) outlives its module and
    nanobind prints "leaked N instances/types/functions" (~40 lines) at every exit."""
    global _unfreeze_at_exit
    gc.collect()
    gc.freeze()
    if not _unfreeze_at_exit:
        atexit.register(gc.unfreeze)
        _unfreeze_at_exit = True


def resolve_qualname(target: Any) -> Any:
    """Import ``"package.module:Name"`` (or ``"package.module.Name"``); pass objects through."""
    if not isinstance(target, str):
        return target
    if ":" in target:
        module_name, _, attr = target.partition(":")
    else:
        module_name, _, attr = target.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"{target!r} is not a qualified name like 'package.module:ClassName'")
    module = importlib.import_module(module_name)
    try:
        obj: Any = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise ValueError(f"{module_name!r} has no attribute {attr!r} (from {target!r})") from None
    return obj
