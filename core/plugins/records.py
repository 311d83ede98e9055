"""What happened to each plugin in this process: its status and why (``host plugins list``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

LOADED = "loaded"
BLOCKED = "blocked"
NOT_ALLOWLISTED = "not-allowlisted"
FAILED = "failed"
NOT_LOADED = "not-loaded"  # discovered, allowed, but its group is not loaded in this process


@dataclass
class PluginRecord:
    """What happened to one plugin in this process; what ``host plugins list`` shows."""

    name: str
    group: str
    value: str
    distribution: str
    version: str
    builtin: bool
    processes: tuple[str, ...]
    status: str
    reason: str = ""
    hooks: list[str] = field(default_factory=list)
    registered: list[str] = field(default_factory=list)
    fatal: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "group": self.group,
            "value": self.value,
            "distribution": self.distribution,
            "version": self.version,
            "builtin": self.builtin,
            "source": "builtin" if self.builtin else "third-party",
            "processes": list(self.processes),
            "status": self.status,
            "reason": self.reason,
            "hooks": sorted(self.hooks),
            "registered": list(self.registered),
        }
