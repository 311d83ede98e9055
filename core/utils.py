"""Small helpers shared across the core."""

from __future__ import annotations

import importlib
from typing import Any


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
