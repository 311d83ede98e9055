"""The ``host serve`` options, built from :class:`~host.core.entrypoints.server_settings.ServerSettings`
(its fields' ``flag(...)`` metadata), as :mod:`.engine_flags` builds the engine options.

A field ``max_request_bytes`` becomes ``--max-request-bytes`` (or the field's ``names``), with
the field's default, ``envvar`` and ``min``: a boolean off by default is a plain switch, one on by
default a pair (``--x/--no-x``); a list field is a repeatable option. The command receives the
values as one parameter, ``server_flags`` (``{field: value}``); :func:`server_settings` turns
them into the settings object (a ``ValueError`` names a bad value), so the command can report
it as a usage error.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any, Callable, Optional

import typer

from host.core.config.flags import flag_name, flag_value_type
from host.core.entrypoints.cli.flag_groups import add_flag_group
from host.core.entrypoints.server_settings import ServerSettings, read_chat_template


def server_fields() -> list[dataclasses.Field]:
    """The ``ServerSettings`` fields that are command-line flags, in declaration order."""
    return [f for f in dataclasses.fields(ServerSettings) if f.metadata["cli"]]


def field_default(field: dataclasses.Field) -> Any:
    """The settings field's default (a fresh one for a ``factory`` field)."""
    return field.default_factory() if field.default is dataclasses.MISSING else field.default  # type: ignore[misc]


def option_names(field: dataclasses.Field) -> list[str]:
    """The option's spellings: the field's ``names``, else ``--field-name`` (a pair
    ``--name/--no-name`` for a boolean on by default)."""
    if field.metadata["names"]:
        return list(field.metadata["names"])
    name = flag_name(field)
    if field_default(field) is True:
        return [f"{name}/--no-{name[2:]}"]
    return [name]


def _value_type(field: dataclasses.Field) -> Any:
    return flag_value_type(ServerSettings, field)


def _option(field: dataclasses.Field) -> inspect.Parameter:
    meta = field.metadata
    kind = _value_type(field)
    default = field_default(field)
    extra: dict[str, Any] = {}
    if meta["envvar"]:
        extra["envvar"] = meta["envvar"]
    if meta["min"] is not None:
        extra["min"] = meta["min"]
    if kind is bool:
        annotation: Any = bool
    elif typing.get_origin(kind) is list:
        annotation, default = Optional[kind], None  # a repeatable option: None when not given, the field's []
    elif kind in (int, float, str):
        annotation = kind if default is not None else Optional[kind]
    else:
        raise ValueError(f"ServerSettings.{field.name} is a {kind}, which no command-line option reads; give it cli=False")
    option = typer.Option(default, *option_names(field), help=meta["help"], **extra)
    return inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)


def server_options() -> list[inspect.Parameter]:
    """One typer option per server flag, as signature parameters."""
    return [_option(f) for f in server_fields()]


def _collect(**flags: Any) -> dict[str, Any]:
    return flags


def with_server_flags(func: Callable[..., Any]) -> Callable[..., Any]:
    """Give a typer command every server flag, received as ``server_flags`` (see the module)."""
    return add_flag_group(func, "server_flags", server_options(), _collect)


def server_settings(**flags: Any) -> ServerSettings:
    """The settings from the server flags' values: a repeatable option not given is the empty
    list, ``--chat-template`` is read (a file or the template text); a bad value is a
    ``ValueError`` naming the flag."""
    fields = {f.name: f for f in dataclasses.fields(ServerSettings)}
    values: dict[str, Any] = {}
    for name, value in flags.items():
        field = fields.get(name)
        if field is None or not field.metadata["cli"]:
            raise ValueError(f"{name!r} is not a server flag; the server flags are {', '.join(f.name for f in server_fields())}")
        if value is None and typing.get_origin(_value_type(field)) is list:
            value = field_default(field)
        elif field.metadata["parse"] == "chat_template":
            value = read_chat_template(value)
        values[name] = list(value) if isinstance(value, (list, tuple)) else value
    return ServerSettings(**values)
