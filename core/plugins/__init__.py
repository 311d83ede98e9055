"""The plugin host: per-process discovery and loading of entry-point plugins."""

from host.core.plugins import kernel_filler  # noqa: E402,F401,I001 - installs the kernel table's filler
from host.core.plugins.manager import (
    PluginConfigError,
    PluginError,
    PluginHost,
    PluginRecord,
    bootstrap_process,
    get_plugin_host,
    plugin_host_for,
)
from host.core.plugins.settings import PluginSettings

__all__ = [
    "PluginConfigError",
    "PluginError",
    "PluginHost",
    "PluginRecord",
    "PluginSettings",
    "bootstrap_process",
    "get_plugin_host",
    "plugin_host_for",
]
