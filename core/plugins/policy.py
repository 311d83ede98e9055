"""The loading policy: which discovered plugin loads, which failure is fatal, which hook a
plugin may implement. Pure decisions on :class:`PluginSettings` and a :class:`Candidate`.

- ``--block-plugins`` wins over everything, built-ins included.
- Built-ins load unless blocked.
- Third-party endpoint plugins load only when named in ``--plugins`` (they add HTTP routes).
- With an allowlist set, only the third-party plugins it names load; unset, all of them do.
- A failure is fatal in strict mode, for an allowlisted plugin and for a built-in.
- A module registered under a group implements only that group's hooks and ``host.general``'s.
"""

from __future__ import annotations

from typing import Iterable

from host.core.plugins.discovery import Candidate, normalize_name
from host.core.plugins.records import BLOCKED, LOADED, NOT_ALLOWLISTED
from host.core.plugins.settings import PluginSettings
from host.hooks.groups import ENDPOINTS_GROUP, GENERAL_GROUP, hook_group


def matches(names: Iterable[str], cand: Candidate) -> bool:
    """Whether ``names`` (as typed in a setting) name ``cand`` by entry-point or distribution."""
    wanted = {normalize_name(n) for n in names}
    return normalize_name(cand.name) in wanted or normalize_name(cand.distribution) in wanted


def unknown_allowlisted(settings: PluginSettings, candidates: Iterable[Candidate]) -> list[str]:
    """The allowlisted names that match none of ``candidates``."""
    if settings.allow is None:
        return []
    candidates = list(candidates)
    return [n for n in settings.allow if not any(matches([n], c) for c in candidates)]


def decide(settings: PluginSettings, cand: Candidate) -> tuple[str, str]:
    """``(status, reason)`` before loading: ``loaded`` means "should load"."""
    if settings.block and matches(settings.block, cand):
        return BLOCKED, "blocked by --block-plugins / HOST_BLOCK_PLUGINS"
    if cand.builtin:
        return LOADED, ""
    allow = settings.allow
    if cand.group == ENDPOINTS_GROUP and (allow is None or not matches(allow, cand)):
        return NOT_ALLOWLISTED, (
            "third-party endpoint plugins add HTTP routes and are off by default; "
            f"enable with --plugins {cand.name} (or HOST_PLUGINS={cand.name})"
        )
    if allow is not None and not matches(allow, cand):
        return NOT_ALLOWLISTED, f"not named in --plugins / HOST_PLUGINS ({','.join(allow) or 'empty'})"
    return LOADED, ""


def is_fatal(settings: PluginSettings, cand: Candidate) -> bool:
    """Whether a failure of ``cand`` stops start-up."""
    explicitly = settings.allow is not None and matches(settings.allow, cand)
    return settings.strict or explicitly or cand.builtin


def hook_problem(cand: Candidate, hooks: Iterable[str]) -> str | None:
    """Why ``cand`` may not implement one of ``hooks`` (the first offending one), or ``None``."""
    for hook in hooks:
        owner = hook_group(hook)
        if owner is None:
            return (
                f"module {cand.value} implements {hook!r}, which is not a host hook; "
                "check the spelling against host.hooks"
            )
        if owner not in (cand.group, GENERAL_GROUP):
            return (
                f"module {cand.value} is registered under {cand.group} but implements "
                f"{hook!r} of {owner}; register it under {owner} in its entry points"
            )
    return None
