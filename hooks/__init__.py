"""Hook specifications of host, one module per hook family.

Each spec module declares its entry-point group and the processes that load it;
:mod:`host.hooks.groups` gathers those declarations into ``GROUPS`` and ``FAMILY_MODULES`` (the
hook-spec module that defines what a plugin registered under a group may implement; every group
may also implement ``host.general``).
"""

from __future__ import annotations

from host.hooks.groups import (
    ENDPOINTS_GROUP,
    FAMILY_MODULES,
    GENERAL_GROUP,
    GROUPS,
    MODELS_GROUP,
    PLATFORMS_GROUP,
    PROCESSES,
    Group,
    all_hook_names,
    groups_for,
    hook_group,
    hook_names,
)
from host.hooks.markers import PROJECT_NAME, hookimpl, hookspec

__all__ = [
    "ENDPOINTS_GROUP",
    "FAMILY_MODULES",
    "GENERAL_GROUP",
    "GROUPS",
    "MODELS_GROUP",
    "Group",
    "PLATFORMS_GROUP",
    "PROCESSES",
    "PROJECT_NAME",
    "all_hook_names",
    "groups_for",
    "hook_group",
    "hook_names",
    "hookimpl",
    "hookspec",
]
