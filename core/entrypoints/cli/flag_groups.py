"""Flag groups: a set of options declared once and given to several ``host`` commands.

A command asks for a group by naming one parameter (e.g. ``engine_kwargs``); :func:`add_flag_group`
replaces that parameter in the signature typer reads with the group's options, and calls the
command with the converted values of those options under that one name. Typer builds the
command from ``inspect.signature`` and ``typing.get_type_hints``, so the command carries both
a ``__signature__`` and real (not string) ``__annotations__``. :class:`GroupedHelpCommand` shows
each group under its own heading in ``--help``.
"""

from __future__ import annotations

import functools
import inspect
import typing
from typing import Any, Callable

import typer
import typer.core


def add_flag_group(
    func: Callable[..., Any], into: str, options: list[inspect.Parameter], convert: Callable[..., Any]
) -> Callable[..., Any]:
    """``func`` as a typer command with ``options`` in place of its parameter ``into``, which
    receives ``convert(**values of options)``.

    ``options`` are keyword-only parameters whose defaults are ``typer.Option`` objects and
    whose annotations are types; a name clash with ``func``'s own parameters is a ``ValueError``.
    """
    signature = inspect.signature(func)
    if into not in signature.parameters:
        raise ValueError(f"{func.__name__} has no parameter {into!r} to receive the flag group; add one")
    hints = typing.get_type_hints(func)
    own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in signature.parameters.values() if p.name != into]
    clash = sorted({p.name for p in own} & {p.name for p in options})
    if clash:
        raise ValueError(f"{func.__name__} declares {', '.join(clash)} itself and through a flag group; keep one")
    names = [p.name for p in options]

    @functools.wraps(func)
    def command(**kwargs: Any) -> Any:
        values = {name: kwargs.pop(name) for name in names}
        return func(**kwargs, **{into: convert(**values)})

    params = [*own, *options]
    command.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params} | {"return": hints.get("return")}
    return command


class GroupedHelpCommand(typer.core.TyperCommand):
    """A typer command whose ``--help`` lists its options under one heading per group (the
    options' ``rich_help_panel``: ``Engine``, ``Plugins``), as plain text: long option names
    are never cut, whatever the terminal width."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "rich_markup_mode": None})  # plain click help

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        """vLLM's nested config spellings (``--x-config.key value``, ``-O.key=value``) and
        underscore spellings are folded into this command's options first (:mod:`.nested_args`)."""
        from host.core.entrypoints.cli.nested_args import NestedArgsError, rewrite_nested_args

        options = {
            opt: not getattr(param, "is_flag", False) and param.nargs != 0
            for param in self.get_params(ctx) if param.param_type_name == "option"
            for opt in (*param.opts, *param.secondary_opts)
        }
        try:
            args = rewrite_nested_args(list(args), options)
        except NestedArgsError as exc:
            raise typer.BadParameter(str(exc), ctx) from None
        return super().parse_args(ctx, args)

    def format_options(self, ctx: Any, formatter: Any) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            default = "Arguments" if param.param_type_name == "argument" else "Options"
            sections.setdefault(getattr(param, "rich_help_panel", None) or default, []).append(record)
        for heading, rows in sections.items():
            with formatter.section(heading):
                formatter.write_dl(rows)
