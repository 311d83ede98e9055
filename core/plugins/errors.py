"""The two errors the plugin host raises at start-up."""

from __future__ import annotations


class PluginError(RuntimeError):
    """A plugin failure that stops start-up (strict mode, allowlisted, or built-in)."""


class PluginConfigError(ValueError):
    """A plugin setting names something that does not exist."""
