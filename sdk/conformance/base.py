"""What every suite checks first: the plugin module registers the plugin through its family's hook."""

from __future__ import annotations

from typing import Any, ClassVar


class RegistrationCheck:
    """Set ``plugin_module`` (the module, or object, holding your ``@hookimpl``) to also check
    that loading it registers ``registered_name`` in the family's registry; leave it ``None``
    to skip (for example when you test a class outside its package)."""

    plugin_module: ClassVar[Any] = None
    registry_kind: ClassVar[str] = ""  # set by each suite
    group: ClassVar[str] = ""

    def registered_name(self) -> str:
        raise NotImplementedError

    def test_the_plugin_module_registers_it(self) -> None:
        if self.plugin_module is None:
            return
        from host.sdk.testing import isolated_plugin_host, registered_plugin

        with isolated_plugin_host(builtins=False) as host, registered_plugin(
            self.plugin_module, name="conformance-under-test", group=self.group, host=host
        ):
            names = set(host.registry(self.registry_kind))
        assert self.registered_name() in names, (
            f"loading {self.plugin_module!r} registered {sorted(names)} in {self.registry_kind!r}, not "
            f"{self.registered_name()!r}: does its @hookimpl call register(...) with it?"
        )
