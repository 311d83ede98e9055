"""The entry-point groups and which process loads which, as the plugin host reads them.

The facts are declared once, by the hook-spec modules, and gathered in :mod:`host.hooks.groups`;
this module re-exports that table for the code under ``host.core`` that imports it from here.
"""

from __future__ import annotations

from host.hooks.groups import (
    ENDPOINTS_GROUP,
    GENERAL_GROUP,
    GROUPS,
    PLATFORMS_GROUP,
    PROCESSES,
    Group,
    groups_for,
)

__all__ = ["ENDPOINTS_GROUP", "GENERAL_GROUP", "GROUPS", "PLATFORMS_GROUP", "PROCESSES", "Group", "groups_for"]
