"""``flag(...)``: a dataclass field that is also a command-line flag — the one mechanism by which
every engine flag (:class:`host.core.engine_args.EngineArgs`) and server flag
(:class:`host.core.entrypoints.server_settings.ServerSettings`) is declared."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any


def flag(
    default: Any = None,
    *,
    help: str,
    short: str | None = None,
    cli: bool = True,
    choices: tuple[Any, ...] | None = None,
    parse: str | None = None,
    default_text: str | None = None,
    factory: Any = None,
    names: tuple[str, ...] | None = None,
    envvar: str | None = None,
    min: float | None = None,
) -> Any:
    """A dataclass field that is also a command-line flag ``--field-name``: the one declaration
    of an engine flag (:class:`EngineArgs`) or a server flag
    (:class:`host.core.entrypoints.server_settings.ServerSettings`).

    :param help: one line saying what the flag does (shown by ``--help`` and in the docs table).
    :param short: a short spelling, e.g. ``"-O"``.
    :param cli: ``False`` for a keyword only ``LLM(...)`` takes (no command-line flag).
    :param choices: the accepted values, when there is a fixed set.
    :param parse: how the command line's text becomes the value: ``"bytes"`` (``2GiB``) or
        ``"graph_sizes"`` (``1,2,4,8``, ``none``).
    :param default_text: what the default means, when ``default`` alone does not say it
        (e.g. ``None`` meaning "the model's").
    :param factory: a function making the default (a list), instead of ``default``.
    :param names: the option's spellings, when they are not ``--field-name`` (server flags:
        ``("--served-model-name",)``, or ``("--x/--no-x",)`` for a pair that is off by default).
    :param envvar: an environment variable the flag defaults to (server flags).
    :param min: the smallest value a number flag takes (server flags).
    """
    meta = {
        "help": help, "short": short, "cli": cli, "choices": choices, "parse": parse, "default_text": default_text,
        "names": names, "envvar": envvar, "min": min,
    }
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def flag_name(field: dataclasses.Field) -> str:
    """The option a flag field is by default: ``max_num_seqs`` -> ``--max-num-seqs``."""
    return "--" + field.name.replace("_", "-")


def flag_value_type(cls: type, field: dataclasses.Field) -> Any:
    """The type of value a flag field of dataclass ``cls`` holds, ``None`` aside: ``int`` for
    ``int | None``, ``list[str]`` for ``list[str] | None``."""
    hint = typing.get_type_hints(cls)[field.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) in (typing.Union, types.UnionType) else hint
