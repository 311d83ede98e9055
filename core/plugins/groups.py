"""The entry-point groups and which process loads which (the table in ARCHITECTURE.md)."""

from __future__ import annotations

from dataclasses import dataclass

PROCESSES: tuple[str, ...] = ("api", "engine", "worker")


@dataclass(frozen=True)
class Group:
    """One entry-point group: its name and the processes that load it."""

    name: str
    processes: tuple[str, ...]
    lazy_in: tuple[str, ...] = ()  # processes that load it only on first use
    summary: str = ""


GROUPS: dict[str, Group] = {
    g.name: g
    for g in (
        Group("host.general", ("api", "engine", "worker"), summary="models registry, config tweaks, startup"),
        Group("host.platforms", ("api", "engine", "worker"), lazy_in=("api",), summary="hardware platforms"),
        Group("host.attention_backends", ("engine", "worker"), summary="paged-attention backends"),
        Group("host.quantization", ("engine", "worker"), summary="quantization methods"),
        Group("host.kv_connectors", ("engine", "worker"), summary="KV transfer connectors"),
        Group("host.executors", ("engine",), summary="executors"),
        Group("host.io_processors", ("api",), summary="request/response processors"),
        Group("host.endpoints", ("api",), summary="HTTP routes (third-party ones are opt-in)"),
        Group("host.stat_loggers", ("api",), summary="metrics sinks"),
    )
}

ENDPOINTS_GROUP = "host.endpoints"
PLATFORMS_GROUP = "host.platforms"
GENERAL_GROUP = "host.general"


def groups_for(process: str, include_lazy: bool = True) -> list[str]:
    """The groups ``process`` loads, in table order (lazy ones only if ``include_lazy``)."""
    if process not in PROCESSES:
        raise ValueError(f"unknown process {process!r}; expected one of {', '.join(PROCESSES)}")
    return [
        g.name
        for g in GROUPS.values()
        if process in g.processes and (include_lazy or process not in g.lazy_in)
    ]
