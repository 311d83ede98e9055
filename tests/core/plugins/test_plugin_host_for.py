"""``plugin_host_for``: the plugin flags (``--plugins``, ``--block-plugins``,
``--strict-plugins``, ``--platform``) turned into this process's plugin host."""

from __future__ import annotations

import pytest

from host.core.plugins import plugin_host_for
from host.core.plugins.manager import PluginHost, get_plugin_host
from host.core.plugins.platform import current_resolution
from host.core.plugins.settings import PluginSettings
from host.sdk.testing import isolated_plugin_host


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("HOST_PLUGINS", "HOST_BLOCK_PLUGINS", "HOST_STRICT_PLUGINS", "HOST_PLATFORM", "HOST_TRACE_PLUGINS"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_nothing_given_is_the_current_host(clean_env):
    with isolated_plugin_host(PluginSettings(block=("cuda",))) as host:
        assert plugin_host_for() is host
        assert plugin_host_for(None, None, None, None) is host
        assert get_plugin_host() is host


def test_same_settings_keep_the_host_and_its_platform(clean_env):
    with isolated_plugin_host(PluginSettings(platform="cpu")) as host:
        resolution = current_resolution()
        assert plugin_host_for(platform="cpu") is host
        assert current_resolution() is resolution  # nothing reset


def test_other_settings_install_a_new_host_and_reset_the_platform(clean_env):
    clean_env.setenv("HOST_BLOCK_PLUGINS", "rocm")
    with isolated_plugin_host() as host:
        resolution = current_resolution()
        new = plugin_host_for(plugins="", strict_plugins=True, platform="cpu")
        assert isinstance(new, PluginHost) and new is not host
        assert get_plugin_host() is new
        # given values override their variables; the others still come from the environment
        assert new.settings == PluginSettings(allow=(), block=("rocm",), strict=True, platform="cpu")
        assert not new.loaded_groups  # nothing is loaded until a process bootstraps
        after = current_resolution()
        assert after is not resolution and after.platform.name == "cpu" and "forced" in after.reason
        assert plugin_host_for(plugins="", strict_plugins=True, platform="cpu") is new
    assert get_plugin_host() is not new  # the isolated host's predecessor is back
