"""Platform resolution: which :class:`host.sdk.Platform` this process runs on, and why.

Rules, in order:

1. ``HOST_PLATFORM`` / ``--platform NAME`` forces the platform whose ``name`` (or plugin
   entry-point name) is NAME; an unknown name is an error listing the registered ones.
2. Exactly one detected third-party platform wins over the built-ins.
3. Two or more detected third-party platforms are an error naming them all and the override.
4. Among built-ins, ``cuda`` and ``rocm`` are preferred over ``cpu``.

A ``detect()`` that raises counts as "not here", and the exception is kept in the resolution so
``host platform`` shows it instead of hiding it. A platform class may also offer a
``detection_reason()`` classmethod returning one line on why it was or was not detected
("torch is not a ROCm build ..."); ``host platform`` prints it next to the probe.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from host.core.plugins.manager import PluginHost, get_plugin_host
from host.hooks.groups import PLATFORMS_GROUP
from host.interfaces.platform import Platform, UnspecifiedPlatform

logger = logging.getLogger("host.platform")

BUILTIN_ORDER = ("cuda", "rocm", "cpu")


class PlatformResolutionError(RuntimeError):
    """No single platform can be chosen; the message says how to choose one."""


@dataclass
class PlatformProbe:
    """The answer of one registered platform class to ``detect()``."""

    name: str
    plugin: str
    builtin: bool
    detected: bool
    error: str = ""
    reason: str = ""  # the platform's own explanation (``detection_reason()``), if it gives one

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "plugin": self.plugin,
            "builtin": self.builtin,
            "detected": self.detected,
            "error": self.error,
            "reason": self.reason,
        }


@dataclass
class PlatformResolution:
    """The chosen platform plus every probe and the reason it won."""

    platform: Platform
    reason: str
    probes: list[PlatformProbe] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "platform": self.platform.describe(),
            "reason": self.reason,
            "probes": [p.to_dict() for p in self.probes],
        }


def probe_platforms(host: PluginHost) -> tuple[list[PlatformProbe], dict[str, type[Platform]]]:
    """Ask every registered platform class whether its hardware is here."""
    registry = host.registry("platforms")
    probes: list[PlatformProbe] = []
    for name, cls in registry.items():
        plugin = host.registry_owner("platforms", name)
        record = host.records.get(plugin)
        builtin = bool(record.builtin) if record is not None else False
        try:
            detected = bool(cls.detect())
            error = ""
        except Exception as exc:  # noqa: BLE001 - recorded and shown, not swallowed
            detected, error = False, f"{type(exc).__name__}: {exc}"
            logger.warning("platform %s: detect() raised %s", name, error)
        probes.append(PlatformProbe(name, plugin, builtin, detected, error, _detection_reason(cls)))
    return probes, registry


def _detection_reason(cls: type[Platform]) -> str:
    """The class's ``detection_reason()`` (``""`` from the base class); an exception in it is
    reported as the reason instead of breaking resolution."""
    try:
        return str(cls.detection_reason() or "")
    except Exception as exc:  # noqa: BLE001 - an explanation must not break resolution
        return f"detection_reason() raised {type(exc).__name__}: {exc}"


def resolve_platform(host: PluginHost, forced: str | None = None) -> PlatformResolution:
    """Apply the resolution rules to the loaded platform plugins."""
    host.load_groups([PLATFORMS_GROUP])
    probes, registry = probe_platforms(host)
    forced = forced if forced is not None else host.settings.platform
    if forced:
        for probe in probes:
            plugin_name = probe.plugin.split(":", 1)[-1]
            if forced in (probe.name, plugin_name):
                cls = registry[probe.name]
                note = ""
                if not probe.detected:
                    why = f": {probe.reason or probe.error}" if (probe.reason or probe.error) else ""
                    note = f" (its detect() said the hardware is not here{why})"
                return PlatformResolution(cls(), f"forced by --platform / HOST_PLATFORM={forced}{note}", probes)
        raise PlatformResolutionError(
            f"--platform / HOST_PLATFORM={forced!r} matches no registered platform; "
            f"registered: {', '.join(p.name for p in probes) or 'none'}"
        )
    third_party = [p for p in probes if p.detected and not p.builtin]
    if len(third_party) > 1:
        names = ", ".join(f"{p.name} (plugin {p.plugin.split(':', 1)[-1]})" for p in third_party)
        raise PlatformResolutionError(
            f"more than one third-party platform detected its hardware: {names}. Choose one with "
            f"--platform NAME or HOST_PLATFORM=NAME (e.g. HOST_PLATFORM={third_party[0].name}), or "
            "block the others with --block-plugins"
        )
    if third_party:
        p = third_party[0]
        return PlatformResolution(registry[p.name](), f"third-party platform {p.name} detected its hardware", probes)
    builtins = {p.name: p for p in probes if p.detected and p.builtin}
    accel = [n for n in BUILTIN_ORDER[:-1] if n in builtins]
    if len(accel) > 1:
        raise PlatformResolutionError(
            f"built-in platforms {', '.join(accel)} all detected hardware; choose one with "
            "--platform NAME or HOST_PLATFORM=NAME"
        )
    for name in BUILTIN_ORDER:
        if name in builtins:
            return PlatformResolution(registry[name](), f"built-in platform {name} detected its hardware", probes)
    other = [p for p in probes if p.detected]
    if other:
        return PlatformResolution(registry[other[0].name](), f"platform {other[0].name} detected its hardware", probes)
    errors = "; ".join(f"{p.name}: {p.error}" for p in probes if p.error)
    return PlatformResolution(
        UnspecifiedPlatform(),
        "no platform detected its hardware" + (f" (errors: {errors})" if errors else ""),
        probes,
    )


_RESOLVED: dict[int, tuple[PluginHost, PlatformResolution]] = {}


def current_resolution() -> PlatformResolution:
    """The resolution for this process and its current plugin host, computed once per host
    (lazily: the API process loads the platform group only when something first asks). A new
    plugin host (``configure_plugin_host`` with other settings, the testing kit) is resolved
    anew."""
    pid = os.getpid()
    host = get_plugin_host()
    cached = _RESOLVED.get(pid)
    if cached is None or cached[0] is not host:
        _RESOLVED.clear()
        res = resolve_platform(host)
        _RESOLVED[pid] = (host, res)
        logger.info("Platform: %s (%s)", res.platform.name, res.reason)
    return _RESOLVED[pid][1]


def current_platform() -> Platform:
    return current_resolution().platform


def reset_current_platform() -> None:
    """Forget the cached resolution (testing kit)."""
    _RESOLVED.clear()
