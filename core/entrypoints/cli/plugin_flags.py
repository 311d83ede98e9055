"""The plugin flags every ``host`` command that loads plugins takes: ``--plugins``,
``--block-plugins``, ``--strict-plugins/--no-strict-plugins`` and ``--platform``.

Each overrides its environment variable (``HOST_PLUGINS``, ``HOST_BLOCK_PLUGINS``,
``HOST_STRICT_PLUGINS``, ``HOST_PLATFORM``); a flag not given leaves the variable in charge.
The command receives them as one parameter, ``plugin_flags``: the keywords ``LLM(...)`` takes
(``plugins``, ``block_plugins``, ``strict_plugins``, ``platform``), ``None`` where not given.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

import typer

from host.core.entrypoints.cli.flag_groups import add_flag_group

PANEL = "Plugins"


def _option(name: str, annotation: Any, *decls: str, help: str) -> inspect.Parameter:
    option = typer.Option(None, *decls, help=help, rich_help_panel=PANEL)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)


def plugin_options() -> list[inspect.Parameter]:
    return [
        _option("plugins", Optional[str], "--plugins",
                help="Allowlist of third-party plugins (comma separated; '' loads none). Default: HOST_PLUGINS."),
        _option("block_plugins", Optional[str], "--block-plugins",
                help="Plugins never to load, built-ins included. Default: HOST_BLOCK_PLUGINS."),
        _option("strict_plugins", Optional[bool], "--strict-plugins/--no-strict-plugins",
                help="Make any plugin failure fatal. Default: HOST_STRICT_PLUGINS."),
        _option("platform", Optional[str], "--platform",
                help="Force a platform by name (host platform shows them). Default: HOST_PLATFORM."),
    ]


def _collect(**flags: Any) -> dict[str, Any]:
    return flags


def with_plugin_flags(func: Callable[..., Any]) -> Callable[..., Any]:
    """Give a typer command the plugin flags, received as ``plugin_flags`` (see the module)."""
    return add_flag_group(func, "plugin_flags", plugin_options(), _collect)
