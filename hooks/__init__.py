"""Hook specifications of host, one module per hook family.

``FAMILY_MODULES`` maps each entry-point group to the hook-spec module that defines what a plugin
registered under that group may implement (every group may also implement ``host.general``).
"""

from __future__ import annotations

from types import ModuleType

from host.hooks import (
    attention,
    endpoints,
    executors,
    general,
    io_processors,
    kv_connectors,
    platforms,
    quantization,
    stat_loggers,
)
from host.hooks.markers import PROJECT_NAME, hookimpl, hookspec

FAMILY_MODULES: dict[str, ModuleType] = {
    "host.general": general,
    "host.platforms": platforms,
    "host.attention_backends": attention,
    "host.quantization": quantization,
    "host.kv_connectors": kv_connectors,
    "host.executors": executors,
    "host.io_processors": io_processors,
    "host.endpoints": endpoints,
    "host.stat_loggers": stat_loggers,
}


def hook_names(module: ModuleType) -> set[str]:
    """The hook names a spec module defines."""
    return {name for name in dir(module) if name.startswith("host_")}


def hook_group(hook_name: str) -> str | None:
    """The entry-point group whose spec module defines ``hook_name``, or ``None``."""
    for group, module in FAMILY_MODULES.items():
        if hook_name in hook_names(module):
            return group
    return None


__all__ = ["FAMILY_MODULES", "PROJECT_NAME", "hook_group", "hook_names", "hookimpl", "hookspec"]
