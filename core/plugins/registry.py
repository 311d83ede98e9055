"""The host-owned registries, each fed by one collector hook through ``register(...)`` callbacks.

The collector hooks are derived from the hook names in :mod:`host.hooks`: every
``host_register_<kind>`` hook collects into registry ``<kind>`` (``host_register_platforms`` ->
``"platforms"``, ``host_register_quantization_methods`` -> ``"quantization_methods"``).

``register(obj)`` keys ``obj`` by its ``name`` attribute; ``register(key, value)`` keys
``value`` by the string ``key`` (``register("LlamaForCausalLM", "pkg.mod:Cls")``). Two plugins
registering one key is a :class:`PluginError` naming both.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from host.core.plugins.errors import PluginError
from host.core.plugins.records import PluginRecord
from host.hooks.groups import all_hook_names

COLLECTOR_PREFIX = "host_register_"


def collector_table(hooks: Iterable[str]) -> dict[str, str]:
    """``{collector hook: registry kind}`` for the ``host_register_<kind>`` names in ``hooks``,
    in their order; other hooks are not collectors."""
    return {hook: hook[len(COLLECTOR_PREFIX) :] for hook in hooks if hook.startswith(COLLECTOR_PREFIX)}


# collector hook -> registry kind, in hook-family order
COLLECTORS: dict[str, str] = collector_table(all_hook_names())
REGISTRY_HOOK: dict[str, str] = {kind: hook for hook, kind in COLLECTORS.items()}


def registry_key(obj: Any) -> str:
    """The key ``register(obj)`` files ``obj`` under: its non-empty string ``name``."""
    name = getattr(obj, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(
            f"{obj!r} has no non-empty string 'name'; set the class field 'name' to the key "
            "users select it by"
        )
    return name


def collector_hook(kind: str) -> str:
    """The hook that feeds registry ``kind``; a ``ValueError`` lists the kinds for a bad one."""
    if kind not in REGISTRY_HOOK:
        raise ValueError(f"unknown registry {kind!r}; expected one of {', '.join(REGISTRY_HOOK)}")
    return REGISTRY_HOOK[kind]


class Registry:
    """One registry: ``entries`` (key -> registered object) and ``owners`` (key -> plugin key)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.entries: dict[str, Any] = {}
        self.owners: dict[str, str] = {}

    def register_for(self, plugin: str, record: PluginRecord | None) -> Callable[..., None]:
        """The ``register`` callback handed to ``plugin``'s collector hook; each entry it adds
        is also listed in ``record.registered`` as ``"<kind>:<key>"``."""

        def register(obj: Any, value: Any = None) -> None:
            key = obj if isinstance(obj, str) else registry_key(obj)
            entry = value if isinstance(obj, str) else obj
            if key in self.entries and self.owners[key] != plugin:
                raise PluginError(
                    f"{self.kind} entry {key!r} is registered by both {self.owners[key]} and {plugin}; "
                    "block one of them with --block-plugins"
                )
            self.entries[key] = entry
            self.owners[key] = plugin
            label = f"{self.kind}:{key}"
            if record is not None and label not in record.registered:
                record.registered.append(label)

        return register
