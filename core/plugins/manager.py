"""The per-process plugin host: loads the groups a process needs and calls their hooks.

One :class:`PluginHost` exists per OS process (keyed by pid, so a forked child builds its own).
A process "bootstraps" a role (``api``, ``engine``, ``worker``): the host loads the entry-point
groups of that role that are not loaded yet, validates each plugin module against its group's
hook family, and then calls ``host_startup(process=role)``. In-process use (the offline ``LLM``)
bootstraps several roles in one process; each group is still loaded only once.

Every failure (import error, hook outside the group, exception in a hook) is recorded as a
:class:`PluginRecord` with ``status="failed"`` and logged at WARNING; it is fatal when the plugin
was named in the allowlist, when strict mode is on, or when the plugin is a built-in.

The parts live beside this module: ``discovery`` (entry-point candidates), ``policy`` (what
loads, what is fatal), ``records`` (what happened to each plugin), ``registry`` (the registries
fed by ``host_register_*`` hooks), ``tracing`` (``HOST_TRACE_PLUGINS``). Their public names are
importable from here too.

The kernel table (:mod:`host.interfaces.kernels`) is filled from here too: its filler
(:mod:`host.core.plugins.kernel_filler`, installed when :mod:`host.core.plugins` is imported) on
the first lookup in a process loads the groups that offer kernels (general, platforms,
quantization), and :meth:`PluginHost.offer_kernels` registers the core's references and calls
``host_offer_kernels``; a plugin loaded later is offered on the next lookup.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Iterable

import pluggy

from host.core.plugins import policy as load_policy
from host.core.plugins import tracing
from host.core.plugins.discovery import BUILTIN_DISTRIBUTION, Candidate, discover_entry_points
from host.core.plugins.errors import PluginConfigError, PluginError
from host.core.plugins.records import BLOCKED, FAILED, LOADED, NOT_ALLOWLISTED, NOT_LOADED, PluginRecord
from host.core.plugins.registry import COLLECTORS, REGISTRY_HOOK, Registry, collector_hook
from host.core.plugins.settings import PluginSettings
from host.hooks.groups import ENDPOINTS_GROUP, FAMILY_MODULES, GENERAL_GROUP, GROUPS, PROCESSES, groups_for
from host.hooks.markers import PROJECT_NAME
from host.interfaces import kernels as kernel_table

logger = logging.getLogger("host.plugins")

__all__ = [
    "BLOCKED",
    "BUILTIN_DISTRIBUTION",
    "COLLECTORS",
    "FAILED",
    "LOADED",
    "NOT_ALLOWLISTED",
    "NOT_LOADED",
    "REGISTRY_HOOK",
    "Candidate",
    "PluginConfigError",
    "PluginError",
    "PluginHost",
    "PluginRecord",
    "bootstrap_process",
    "discover_entry_points",
    "get_plugin_host",
    "plugin_host_for",
    "set_plugin_host",
]


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
        self._registries: dict[str, Registry] = {}
        self._undo_trace: Callable[[], None] | None = None
        self._warned_endpoints = False
        self._kernels_offered: set[str] = set()  # plugin keys whose host_offer_kernels ran
        kernel_table.mark_stale()  # this host's plugins have not offered their kernels yet
        if self.settings.trace:
            self.enable_tracing()

    # -- discovery and policy ----------------------------------------------------------------

    @property
    def candidates(self) -> list[Candidate]:
        if self._candidates is None:
            self._candidates = list(self._discover(GROUPS)) if self._discover else []
        return self._candidates

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
        """The names in ``--plugins`` / ``HOST_PLUGINS`` that match no discovered plugin."""
        return load_policy.unknown_allowlisted(self.settings, self.candidates)

    def policy(self, cand: Candidate) -> tuple[str, str]:
        """``(status, reason)`` before loading: ``loaded`` means "should load"."""
        return load_policy.decide(self.settings, cand)

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
        problem = load_policy.hook_problem(cand, hooks)
        if problem:
            self.pm.unregister(name=cand.key)
            self._fail(cand, record, problem)
            return
        record.status = LOADED
        if "host_offer_kernels" in hooks:
            kernel_table.mark_stale()  # its kernels join the table on the next lookup
        log("Loaded plugin %s (%s, %s %s)", cand.name, cand.group, cand.distribution, cand.version)

    def _fail(self, cand: Candidate, record: PluginRecord, reason: str) -> None:
        record.status = FAILED
        record.reason = reason
        record.fatal = load_policy.is_fatal(self.settings, cand)
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

    def _registry(self, kind: str) -> Registry:
        if kind in self._registries:
            return self._registries[kind]
        hook = collector_hook(kind)
        reg = Registry(kind)
        for impl in reversed(getattr(self.pm.hook, hook).get_hookimpls()):
            register = reg.register_for(impl.plugin_name, self.records.get(impl.plugin_name))
            self._call_one(impl, hook, register=register)
        self._registries[kind] = reg
        self._raise_fatal(True)
        return reg

    def offer_kernels(self, platform: Any, config: Any = None, *, only_new: bool = False) -> None:
        """Fill the kernel table: the core's references, then ``host_offer_kernels`` of every
        loaded plugin (``only_new``: those not offered yet in this host) with a ``register``
        callback that records the plugin as each entry's source. ``config`` is the engine config
        of the model about to be prepared (the worker), ``None`` for the default settings."""
        from host.core.kernels import CORE_SOURCE, offer_core_kernels

        offer_core_kernels(_kernel_register(CORE_SOURCE))
        failed = False
        for impl in reversed(self.pm.hook.host_offer_kernels.get_hookimpls()):
            if only_new and impl.plugin_name in self._kernels_offered:
                continue
            self._kernels_offered.add(impl.plugin_name)
            record = self.records.get(impl.plugin_name)
            register = _kernel_register(record.name if record is not None else impl.plugin_name)
            ok, _ = self._call_one(impl, "host_offer_kernels", register=register, platform=platform, config=config)
            failed = failed or not ok
        if failed:  # a fatal failure of this call stops it; one recorded earlier was raised then
            self._raise_fatal(True)

    def _call_one(self, impl: Any, hook_name: str, **kwargs: Any) -> tuple[bool, Any]:
        """Call one implementation; on an exception, record the plugin as failed, unregister it
        and return ``(False, None)``. A :class:`PluginError` (a host-side verdict such as a
        duplicate registry name) propagates."""
        if self.settings.trace:
            tracing.trace_call(impl.plugin_name, hook_name, kwargs)
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
            tracing.trace_done(impl.plugin_name, hook_name, time.perf_counter() - start, result)
        return True, result

    def _invalidate(self) -> None:
        self._registries.clear()

    # -- tracing and introspection -----------------------------------------------------------

    def enable_tracing(self) -> None:
        """Log every hook call made through ``pm.hook`` (``HOST_TRACE_PLUGINS=1``)."""
        if self._undo_trace is None:
            self._undo_trace = tracing.monitor_hook_calls(self.pm)

    def list_records(self) -> list[PluginRecord]:
        return list(self.records.values())


def _kernel_register(source: str) -> Callable[..., None]:
    """The ``register(op, device_type, impl, *, name, priority=0, reason="")`` callback handed to
    ``host_offer_kernels``, filing each entry under ``source``."""

    def register(op: str, device_type: str, impl: Callable[..., Any], *, name: str, priority: int = 0, reason: str = "") -> None:
        kernel_table.register_kernel(op, device_type, impl, name=name, priority=priority, reason=reason, source=source)

    return register




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
    kernel_table.mark_stale()  # the new host's plugins offer their kernels on the next lookup
    return previous


def plugin_host_for(
    plugins: str | None = None,
    block_plugins: str | None = None,
    strict_plugins: bool | None = None,
    platform: str | None = None,
) -> PluginHost:
    """The plugin host for ``--plugins`` / ``--block-plugins`` / ``--strict-plugins`` /
    ``--platform`` (or the ``LLM(...)`` keywords of the same names); ``None`` means "not given".

    With nothing given, this process's current host. Otherwise the given values override their
    environment variables (:meth:`PluginSettings.from_env`); when the resulting settings equal
    the current host's, that host is returned, else a new host with them is installed as this
    process's host and the cached platform resolution is forgotten. Nothing is loaded here.
    """
    if plugins is None and block_plugins is None and strict_plugins is None and platform is None:
        return get_plugin_host()
    settings = PluginSettings.from_env(plugins=plugins, block_plugins=block_plugins, strict=strict_plugins, platform=platform)
    host = get_plugin_host()
    if host.settings == settings:
        return host
    host = PluginHost(settings)
    set_plugin_host(host)  # core/plugins/platform.py resolves a new host's platform anew
    return host
