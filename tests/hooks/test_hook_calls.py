"""Calling the pick-one and general hooks through the plugin host."""

from __future__ import annotations


def test_select_attention_backend_firstresult(plugin_host, register_plugin):
    from host.sdk import hookimpl

    class Chooser:
        @hookimpl
        def host_select_attention_backend(self, platform, requirements, candidates):
            return "chosen"

    class Abstainer:
        @hookimpl
        def host_select_attention_backend(self, platform, requirements, candidates):
            return None

    register_plugin(Chooser(), name="chooser", group="host.attention_backends")
    register_plugin(Abstainer(), name="abstainer", group="host.attention_backends")
    result = plugin_host.pm.hook.host_select_attention_backend(platform=None, requirements=None, candidates=[])
    assert result == "chosen"


def test_startup_and_adjust_config_hooks(plugin_host, register_plugin):
    from host.sdk import hookimpl

    seen = []

    class General:
        @hookimpl
        def host_startup(self, process):
            seen.append(process)

        @hookimpl
        def host_adjust_config(self, config):
            config["touched"] = True

    register_plugin(General(), name="general")
    plugin_host.bootstrap("engine")
    assert seen == ["engine"]
    cfg: dict = {}
    plugin_host.call_each("host_adjust_config", config=cfg)
    assert cfg == {"touched": True}
