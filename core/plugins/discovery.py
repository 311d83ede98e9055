"""Discovery: the entry points of installed distributions, as candidates not yet imported."""

from __future__ import annotations

import importlib.metadata as md
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from host.hooks.groups import GROUPS

BUILTIN_DISTRIBUTION = "host"


def normalize_name(name: str) -> str:
    """A plugin or distribution name as settings match it: ``My_Plugin.x`` -> ``my-plugin-x``."""
    return name.strip().lower().replace("_", "-").replace(".", "-")


@dataclass(frozen=True)
class Candidate:
    """One discovered entry point, before anything is imported."""

    name: str
    group: str
    value: str
    distribution: str
    version: str
    builtin: bool
    load: Callable[[], Any] = field(compare=False, repr=False)

    @property
    def key(self) -> str:
        """The pluggy registration name; unique across groups."""
        return f"{self.group}:{self.name}"


def discover_entry_points(groups: Iterable[str]) -> list[Candidate]:
    """Every entry point of ``groups`` from installed distributions, in a stable order: by group
    (in :data:`host.hooks.groups.GROUPS` order), built-ins first so they register before
    third-party ones, then by name and distribution."""
    found: list[Candidate] = []
    for group in groups:
        for ep in md.entry_points(group=group):
            dist = getattr(ep, "dist", None)
            dist_name = dist.metadata["Name"] if dist is not None else "<unknown>"
            version = dist.version if dist is not None else ""
            found.append(
                Candidate(
                    name=ep.name,
                    group=group,
                    value=ep.value,
                    distribution=dist_name,
                    version=version,
                    builtin=normalize_name(dist_name) == BUILTIN_DISTRIBUTION,
                    load=ep.load,
                )
            )
    order = list(GROUPS)
    found.sort(key=lambda c: (order.index(c.group), not c.builtin, c.name, c.distribution))
    return found
