"""The per-process plugin host: discovery, allowlist/blocklist, loading, validation, registries.

One :class:`PluginHost` exists per OS process (keyed by pid, so a forked child builds its own).
A process "bootstraps" a role (``api``, ``engine``, ``worker``): the host loads the entry-point
groups of that role that are not loaded yet, validates each plugin module against its group's
hook family, and then calls ``host_startup(process=role)``. In-process use (the offline ``LLM``)
bootstraps several roles in one process; each group is still loaded only once.

Every failure (import error, hook outside the group, exception in a hook) is recorded as a
:class:`PluginRecord` with ``status="failed"`` and logged at WARNING; it is fatal when the plugin
was named in the allowlist, when strict mode is on, or when the plugin is a built-in.
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import pluggy

from host.core.plugins.groups import (
    ENDPOINTS_GROUP,
    GENERAL_GROUP,
    GROUPS,
    PROCESSES,
    groups_for,
)
from host.core.plugins.settings import PluginSettings
from host.hooks import FAMILY_MODULES, PROJECT_NAME, hook_group

logger = logging.getLogger("host.plugins")
trace_logger = logging.getLogger("host.plugins.trace")

BUILTIN_DISTRIBUTION = "host"

LOADED = "loaded"
BLOCKED = "blocked"
NOT_ALLOWLISTED = "not-allowlisted"
FAILED = "failed"
NOT_LOADED = "not-loaded"  # discovered, allowed, but its group is not loaded in this process


class PluginError(RuntimeError):
    """A plugin failure that stops start-up (strict mode, allowlisted, or built-in)."""


class PluginConfigError(ValueError):
    """A plugin setting names something that does not exist."""


def _normalize(name: str) -> str:
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


def discover_entry_points(groups: Iterable[str]) -> list[Candidate]:
    """Every entry point of ``groups`` from installed distributions, in a stable order."""
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
                    builtin=_normalize(dist_name) == BUILTIN_DISTRIBUTION,
                    load=ep.load,
                )
            )
    # builtins first so they register before third-party ones; then by name for stability
    found.sort(key=lambda c: (list(GROUPS).index(c.group), not c.builtin, c.name, c.distribution))
    return found


class _Registry:
    """A host-owned registry fed by one collector hook (``register(...)`` callbacks)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.entries: dict[str, Any] = {}
        self.owners: dict[str, str] = {}


def _registry_key(obj: Any) -> str:
    name = getattr(obj, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(
            f"{obj!r} has no non-empty string 'name'; set the class field 'name' to the key "
            "users select it by"
        )
    return name


# collector hook -> (registry kind, how to derive the key from register(*args))
COLLECTORS: dict[str, str] = {
    "host_register_platforms": "platforms",
    "host_register_attention_backends": "attention_backends",
    "host_register_quantization_methods": "quantization_methods",
    "host_register_kv_connectors": "kv_connectors",
    "host_register_executors": "executors",
    "host_register_io_processors": "io_processors",
    "host_register_endpoints": "endpoints",
    "host_register_stat_loggers": "stat_loggers",
    "host_register_models": "models",
}
REGISTRY_HOOK: dict[str, str] = {kind: hook for hook, kind in COLLECTORS.items()}


class PluginHost:
    """Loads and holds the plugins of one process. Use :func:`get_plugin_host` to get it."""

    def __init__(
        self,
        settings: PluginSettings | None = None,
        *,
        discover: Callable[[Iterable[str]], list[Candidate]] | None = discover_entry_points,
    ) -> None:
        self.settings = settings if settings is not None else PluginSettings.from_env()
        self.pid = os.getpid()
        self.pm = pluggy.PluginManager(PROJECT_NAME)
        for module in FAMILY_MODULES.values():
            self.pm.add_hookspecs(module)
        self._discover = discover
        self._candidates: list[Candidate] | None = None
        self.records: dict[str, PluginRecord] = {}  # key -> record
        self.loaded_groups: set[str] = set()
        self.roles: list[str] = []
        self._registries: dict[str, _Registry] = {}
        self._undo_trace: Callable[[], None] | None = None
        self._warned_endpoints = False
        if self.settings.trace:
            self.enable_tracing()

    # -- discovery and policy ----------------------------------------------------------------

    @property
    def candidates(self) -> list[Candidate]:
        if self._candidates is None:
            self._candidates = list(self._discover(GROUPS)) if self._discover else []
        return self._candidates

    def _matches(self, names: Iterable[str], cand: Candidate) -> bool:
        wanted = {_normalize(n) for n in names}
        return _normalize(cand.name) in wanted or _normalize(cand.distribution) in wanted

    def check_settings(self) -> None:
        """Raise :class:`PluginConfigError` for allowlisted names that match no plugin."""
        unknown = self.unknown_allowlisted()
        if unknown:
            third_party = sorted({c.name for c in self.candidates if not c.builtin})
            raise PluginConfigError(
                f"--plugins / HOST_PLUGINS names {', '.join(repr(n) for n in unknown)}, which "
                f"match no installed plugin (entry-point or distribution name). Installed "
                f"third-party plugins: {', '.join(third_party) or 'none'}. Install the package or "
                "fix the name; 'host plugins list --all' shows every name."
            )

    def unknown_allowlisted(self) -> list[str]:
        if self.settings.allow is None:
            return []
        return [n for n in self.settings.allow if not any(self._matches([n], c) for c in self.candidates)]

    def policy(self, cand: Candidate) -> tuple[str, str]:
        """``(status, reason)`` before loading: ``loaded`` means "should load"."""
        if self.settings.block and self._matches(self.settings.block, cand):
            return BLOCKED, "blocked by --block-plugins / HOST_BLOCK_PLUGINS"
        if cand.builtin:
            return LOADED, ""
        allow = self.settings.allow
        if cand.group == ENDPOINTS_GROUP and (allow is None or not self._matches(allow, cand)):
            return NOT_ALLOWLISTED, (
                "third-party endpoint plugins add HTTP routes and are off by default; "
                f"enable with --plugins {cand.name} (or HOST_PLUGINS={cand.name})"
            )
        if allow is not None and not self._matches(allow, cand):
            return NOT_ALLOWLISTED, f"not named in --plugins / HOST_PLUGINS ({','.join(allow) or 'empty'})"
        return LOADED, ""

    def _is_fatal(self, cand: Candidate) -> bool:
        explicitly = self.settings.allow is not None and self._matches(self.settings.allow, cand)
        return self.settings.strict or explicitly or cand.builtin

    # -- loading -----------------------------------------------------------------------------

    def bootstrap(self, process: str, *, include_lazy: bool = False, raise_on_fatal: bool = True) -> None:
        """Load the groups ``process`` needs (once each) and run its startup hooks."""
        if process not in PROCESSES:
            raise ValueError(f"unknown process {process!r}; expected one of {', '.join(PROCESSES)}")
        self.check_settings()
        self.load_groups(groups_for(process, include_lazy=include_lazy), raise_on_fatal=raise_on_fatal)
        if process not in self.roles:
            self.roles.append(process)
            self.call_each("host_startup", process=process)
            self._raise_fatal(raise_on_fatal)

    def load_groups(self, groups: Iterable[str], *, raise_on_fatal: bool = True) -> None:
        """Load each group in ``groups`` that this process has not loaded yet."""
        for group in groups:
            if group in self.loaded_groups:
                continue
            # mark first: a failure is never retried in this process
            self.loaded_groups.add(group)
            self._load_group(group)
            if self.roles:
                # a group loaded after start-up (lazily): its plugins still get host_startup
                late = {r_key for r_key, r in self.records.items() if r.group == group and r.status == LOADED}
                for role in self.roles:
                    self.call_each("host_startup", _only=late, process=role)
        self._invalidate()
        self._raise_fatal(raise_on_fatal)

    def _load_group(self, group: str) -> None:
        denied_endpoints: list[str] = []
        seen: dict[str, Candidate] = {}
        for cand in (c for c in self.candidates if c.group == group):
            record = PluginRecord(
                name=cand.name,
                group=group,
                value=cand.value,
                distribution=cand.distribution,
                version=cand.version,
                builtin=cand.builtin,
                processes=GROUPS[group].processes,
                status=NOT_LOADED,
            )
            self.records[cand.key] = record
            status, reason = self.policy(cand)
            if status != LOADED:
                record.status, record.reason = status, reason
                if status == BLOCKED:
                    self.pm.set_blocked(cand.key)
                if status == NOT_ALLOWLISTED and group == ENDPOINTS_GROUP:
                    denied_endpoints.append(cand.name)
                logger.debug("plugin %s (%s): %s", cand.name, group, reason)
                continue
            if cand.name in seen:
                other = seen[cand.name]
                self._fail(
                    cand,
                    record,
                    f"entry-point name {cand.name!r} in {group} is also provided by "
                    f"{other.distribution} {other.version}; uninstall one of them (a stale "
                    "*.egg-info or *.dist-info directory can cause this)",
                )
                continue
            seen[cand.name] = cand
            self._load_one(cand, record)
        if denied_endpoints and not self._warned_endpoints:
            self._warned_endpoints = True
            names = ",".join(denied_endpoints)
            logger.warning(
                "Third-party endpoint plugin(s) %s are installed but not enabled: endpoint plugins "
                "add HTTP routes and must be allowlisted. Enable with --plugins %s "
                "(or HOST_PLUGINS=%s).",
                names,
                names,
                names,
            )

    def _load_one(self, cand: Candidate, record: PluginRecord) -> None:
        log = logger.debug if cand.group == GENERAL_GROUP or cand.builtin else logger.info
        try:
            obj = cand.load()
        except BaseException as exc:  # noqa: BLE001 - a plugin import may raise anything
            if isinstance(exc, KeyboardInterrupt):
                raise
            self._fail(cand, record, f"import failed: {type(exc).__name__}: {exc}")
            return
        try:
            self.pm.register(obj, name=cand.key)
        except Exception as exc:  # pluggy validation (bad hook signature...)
            self._fail(cand, record, f"registration failed: {type(exc).__name__}: {exc}")
            return
        hooks = [caller.name for caller in (self.pm.get_hookcallers(obj) or [])]
        record.hooks = hooks
        problem = self._validate_hooks(cand, hooks)
        if problem:
            self.pm.unregister(name=cand.key)
            self._fail(cand, record, problem)
            return
        record.status = LOADED
        log("Loaded plugin %s (%s, %s %s)", cand.name, cand.group, cand.distribution, cand.version)

    @staticmethod
    def _validate_hooks(cand: Candidate, hooks: list[str]) -> str | None:
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

    def _fail(self, cand: Candidate, record: PluginRecord, reason: str) -> None:
        record.status = FAILED
        record.reason = reason
        record.fatal = self._is_fatal(cand)
        logger.warning("Plugin %s (%s, %s) failed: %s", cand.name, cand.group, cand.distribution, reason)

    def _raise_fatal(self, raise_on_fatal: bool) -> None:
        if not raise_on_fatal:
            return
        fatal = [r for r in self.records.values() if r.status == FAILED and r.fatal]
        if fatal:
            lines = "\n".join(f"  - {r.name} ({r.group}, {r.distribution}): {r.reason}" for r in fatal)
            why = (
                "strict plugin loading is on (--strict-plugins / HOST_STRICT_PLUGINS)"
                if self.settings.strict
                else "these plugins are built-in or named in --plugins"
            )
            raise PluginError(
                f"plugin loading failed and {why}:\n{lines}\n"
                "Fix or uninstall the plugin, or block it with --block-plugins NAME."
            )

    # -- in-memory plugins (the testing kit) -------------------------------------------------

    def register_object(self, obj: Any, name: str, group: str = GENERAL_GROUP) -> PluginRecord:
        """Register an in-memory plugin object as if it were discovered under ``group``."""
        if group not in GROUPS:
            raise ValueError(f"unknown group {group!r}; expected one of {', '.join(GROUPS)}")
        cand = Candidate(name, group, repr(obj), "<in-memory>", "", False, load=lambda: obj)
        record = PluginRecord(name, group, cand.value, cand.distribution, "", False, GROUPS[group].processes, NOT_LOADED)
        self.records[cand.key] = record
        self._load_one(cand, record)
        self._invalidate()
        if record.status == FAILED:
            del self.records[cand.key]
            raise PluginError(f"in-memory plugin {name!r} failed: {record.reason}")
        return record

    def unregister_object(self, name: str, group: str = GENERAL_GROUP) -> None:
        key = f"{group}:{name}"
        if self.pm.has_plugin(key):
            self.pm.unregister(name=key)
        self.records.pop(key, None)
        self._invalidate()

    # -- calling hooks -----------------------------------------------------------------------

    def call_each(self, hook_name: str, _only: set[str] | None = None, **kwargs: Any) -> list[tuple[str, Any]]:
        """Call every implementation of ``hook_name`` separately, in pluggy order.

        A raising implementation is recorded as a failure of its plugin and unregistered; the
        others still run. ``_only`` limits the call to those plugin keys. Returns
        ``(plugin_key, result)`` pairs of the implementations that succeeded.
        """
        caller = getattr(self.pm.hook, hook_name)
        results: list[tuple[str, Any]] = []
        for impl in reversed(caller.get_hookimpls()):  # pluggy calls the last registered first
            if _only is not None and impl.plugin_name not in _only:
                continue
            ok, result = self._call_one(impl, hook_name, **kwargs)
            if ok:
                results.append((impl.plugin_name, result))
        return results

    def registry(self, kind: str) -> dict[str, Any]:
        """The host-owned registry ``kind`` (``"platforms"``, ``"attention_backends"``...).

        Built on first use by calling the collector hook of every loaded plugin; two plugins
        registering one name is a :class:`PluginError` naming both.
        """
        return self._registry(kind).entries

    def registry_owner(self, kind: str, name: str) -> str:
        """The plugin that registered ``name`` in registry ``kind``."""
        return self._registry(kind).owners[name]

    def _registry(self, kind: str) -> _Registry:
        if kind in self._registries:
            return self._registries[kind]
        if kind not in REGISTRY_HOOK:
            raise ValueError(f"unknown registry {kind!r}; expected one of {', '.join(REGISTRY_HOOK)}")
        reg = _Registry(kind)
        hook = REGISTRY_HOOK[kind]
        current: list[str] = []

        def register(obj: Any, value: Any = None) -> None:
            plugin = current[0]
            key = obj if isinstance(obj, str) else _registry_key(obj)
            entry = value if isinstance(obj, str) else obj
            if key in reg.entries and reg.owners[key] != plugin:
                raise PluginError(
                    f"{kind} entry {key!r} is registered by both {reg.owners[key]} and {plugin}; "
                    "block one of them with --block-plugins"
                )
            reg.entries[key] = entry
            reg.owners[key] = plugin
            record = self.records.get(plugin)
            label = f"{kind}:{key}"
            if record is not None and label not in record.registered:
                record.registered.append(label)

        caller = getattr(self.pm.hook, hook)
        for impl in reversed(caller.get_hookimpls()):
            current[:] = [impl.plugin_name]
            self._call_one(impl, hook, register=register)
        self._registries[kind] = reg
        self._raise_fatal(True)
        return reg

    def _call_one(self, impl: Any, hook_name: str, **kwargs: Any) -> tuple[bool, Any]:
        """Call one implementation; on an exception, record the plugin as failed, unregister it
        and return ``(False, None)``. A :class:`PluginError` (a host-side verdict such as a
        duplicate registry name) propagates."""
        if self.settings.trace:
            trace_logger.info("call %s -> %s(%s)", impl.plugin_name, hook_name, _fmt_kwargs(kwargs))
        start = time.perf_counter()
        try:
            result = impl.function(**{k: kwargs[k] for k in impl.argnames if k in kwargs})
        except PluginError:
            raise
        except Exception as exc:  # noqa: BLE001 - isolate the plugin
            record = self.records.get(impl.plugin_name)
            if record is None:
                raise
            reason = f"hook {hook_name} raised {type(exc).__name__}: {exc}"
            cand = next((c for c in self.candidates if c.key == impl.plugin_name), None)
            if cand is not None:
                self._fail(cand, record, reason)
            else:  # an in-memory plugin: registered on purpose, so its failure is fatal
                record.status, record.reason, record.fatal = FAILED, reason, True
                logger.warning("Plugin %s failed: %s", record.name, reason)
            self.pm.unregister(name=impl.plugin_name)
            return False, None
        if self.settings.trace:
            trace_logger.info(
                "done %s -> %s in %.3f ms: %r", impl.plugin_name, hook_name, (time.perf_counter() - start) * 1e3, result
            )
        return True, result

    def _invalidate(self) -> None:
        self._registries.clear()

    # -- tracing -----------------------------------------------------------------------------

    def enable_tracing(self) -> None:
        """Log every hook call made through ``pm.hook`` (``HOST_TRACE_PLUGINS=1``)."""
        if self._undo_trace is not None:
            return
        _ensure_trace_handler()

        def before(hook_name: str, hook_impls: list[Any], kwargs: dict[str, Any]) -> None:
            trace_logger.info(
                "call %s(%s) -> [%s]",
                hook_name,
                _fmt_kwargs(kwargs),
                ", ".join(i.plugin_name for i in hook_impls),
            )

        def after(outcome: Any, hook_name: str, hook_impls: list[Any], kwargs: dict[str, Any]) -> None:
            exc = outcome.exception
            trace_logger.info("done %s: %s", hook_name, f"raised {exc!r}" if exc else repr(outcome.get_result()))

        self._undo_trace = self.pm.add_hookcall_monitoring(before, after)

    # -- introspection -----------------------------------------------------------------------

    def list_records(self) -> list[PluginRecord]:
        return list(self.records.values())


def _fmt_kwargs(kwargs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" if not callable(v) else f"{k}=<callable>" for k, v in kwargs.items())


def _ensure_trace_handler() -> None:
    if not trace_logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[host trace pid=%(process)d] %(message)s"))
        trace_logger.addHandler(handler)
        trace_logger.setLevel(logging.INFO)
        trace_logger.propagate = False


# -- the one per-process instance ------------------------------------------------------------

_HOSTS: dict[int, PluginHost] = {}


def get_plugin_host(settings: PluginSettings | None = None) -> PluginHost:
    """This process's plugin host, created on first use (a forked child gets a fresh one).

    ``settings`` applies only when the host is created; pass them from the process's entry
    point (CLI flags), before anything else asks for the host.
    """
    pid = os.getpid()
    host = _HOSTS.get(pid)
    if host is None:
        host = PluginHost(settings)
        _HOSTS.clear()  # drop a parent's host inherited through fork
        _HOSTS[pid] = host
    return host


def bootstrap_process(process: str, settings: PluginSettings | None = None) -> PluginHost:
    """Entry point of every process: load its plugin groups once and run its startup hooks."""
    host = get_plugin_host(settings)
    host.bootstrap(process)
    return host


def set_plugin_host(host: PluginHost | None) -> PluginHost | None:
    """Replace this process's plugin host (testing kit); returns the previous one."""
    pid = os.getpid()
    previous = _HOSTS.pop(pid, None)
    if host is not None:
        _HOSTS[pid] = host
    return previous
