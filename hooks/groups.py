"""The entry-point groups and the processes that load them, gathered from the hook-spec modules.

Each hook-spec module of this package declares the facts of its family once, next to its hooks:

- ``GROUP``: the entry-point group a plugin registers under to implement those hooks;
- ``LOADED_IN``: the processes (of :data:`PROCESSES`) that load the group;
- ``LAZY_IN``: those of ``LOADED_IN`` that load it only on first use;
- ``SUMMARY``: one line on what the group's plugins offer.

This module turns them into the table everything else reads (:data:`GROUPS`, in load order,
and :data:`FAMILY_MODULES`); the plugin host, ``host plugins list`` and the docs read the table
instead of spelling group names again.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from host.hooks import (
    attention,
    endpoints,
    executors,
    general,
    io_processors,
    kv_connectors,
    models,
    platforms,
    quantization,
    reasoning_parsers,
    stat_loggers,
    tool_parsers,
)

PROCESSES: tuple[str, ...] = ("api", "engine", "worker")

# the families in load order: discovery sorts plugins by it and a process loads its groups in it
FAMILIES: tuple[ModuleType, ...] = (
    general,
    models,
    platforms,
    attention,
    quantization,
    kv_connectors,
    executors,
    io_processors,
    endpoints,
    stat_loggers,
    tool_parsers,
    reasoning_parsers,
)


@dataclass(frozen=True)
class Group:
    """One entry-point group: its name and the processes that load it."""

    name: str
    processes: tuple[str, ...]
    lazy_in: tuple[str, ...] = ()  # processes that load it only on first use
    summary: str = ""


def family_group(module: ModuleType) -> Group:
    """The :class:`Group` a hook-spec module declares; a ``ValueError`` names a bad declaration."""
    name, processes, lazy_in = module.GROUP, tuple(module.LOADED_IN), tuple(module.LAZY_IN)
    unknown = [p for p in processes if p not in PROCESSES]
    if unknown:
        raise ValueError(
            f"{module.__name__}.LOADED_IN names {unknown}, which are not processes; "
            f"use some of {', '.join(PROCESSES)}"
        )
    if not set(lazy_in) <= set(processes):
        raise ValueError(
            f"{module.__name__}.LAZY_IN={lazy_in} names processes outside LOADED_IN={processes}; "
            "a group loads lazily only in a process that loads it"
        )
    return Group(name, processes, lazy_in, module.SUMMARY)


GROUPS: dict[str, Group] = {g.name: g for g in map(family_group, FAMILIES)}
FAMILY_MODULES: dict[str, ModuleType] = {m.GROUP: m for m in FAMILIES}

GENERAL_GROUP: str = general.GROUP  # every plugin, whatever its group, may implement these hooks
PLATFORMS_GROUP: str = platforms.GROUP
MODELS_GROUP: str = models.GROUP
ENDPOINTS_GROUP: str = endpoints.GROUP  # third-party endpoint plugins are opt-in


def groups_for(process: str, include_lazy: bool = True) -> list[str]:
    """The groups ``process`` loads, in table order (lazy ones only if ``include_lazy``)."""
    if process not in PROCESSES:
        raise ValueError(f"unknown process {process!r}; expected one of {', '.join(PROCESSES)}")
    return [
        g.name
        for g in GROUPS.values()
        if process in g.processes and (include_lazy or process not in g.lazy_in)
    ]


def hook_names(module: ModuleType) -> set[str]:
    """The hook names a spec module defines."""
    return {name for name in dir(module) if name.startswith("host_")}


def hook_group(hook_name: str) -> str | None:
    """The entry-point group whose spec module defines ``hook_name``, or ``None``."""
    for group, module in FAMILY_MODULES.items():
        if hook_name in hook_names(module):
            return group
    return None


def all_hook_names() -> list[str]:
    """Every hook name of every family, family by family in load order, sorted within one."""
    return [hook for module in FAMILIES for hook in sorted(hook_names(module))]
