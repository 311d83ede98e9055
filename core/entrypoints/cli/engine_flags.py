"""The engine flags of ``host serve``, ``host generate`` and ``host chat``, built from the
fields of :class:`~host.core.engine_args.EngineArgs` (their ``flag(...)`` metadata).

A field ``max_num_seqs`` becomes ``--max-num-seqs`` (plus its short name, if any): a boolean
that defaults to off is a plain switch (``--enforce-eager``), any other boolean a pair
(``--custom-ops/--no-custom-ops``); fields with choices take one of them; ``parse="bytes"``
and ``parse="graph_sizes"`` fields take text (``2GiB``, ``1,2,4,8``). Every option defaults to
"not given", so the engine's own defaults apply; :func:`engine_flag_kwargs` is the one converter
from the options' values to ``EngineArgs`` keywords. :func:`flag_table` is the table in
``docs/engine.md`` (``python -m host.core.entrypoints.cli.engine_flags`` prints it).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Iterable, Literal, Optional

import typer

from host.core.config.flags import flag_name, flag_value_type
from host.core.engine_args import EngineArgs
from host.core.entrypoints.cli.flag_groups import add_flag_group

PANEL = "Engine"


def engine_fields(exclude: Iterable[str] = ()) -> list[dataclasses.Field]:
    """The ``EngineArgs`` fields that are command-line flags, in declaration order."""
    skip = set(exclude)
    return [f for f in dataclasses.fields(EngineArgs) if f.metadata["cli"] and f.name not in skip]




def _value_type(field: dataclasses.Field) -> Any:
    return flag_value_type(EngineArgs, field)


def _is_switch(field: dataclasses.Field) -> bool:
    """A boolean that is off by default: a plain ``--name`` switch, with no ``--no-name``."""
    return _value_type(field) is bool and field.default is False


def default_text(field: dataclasses.Field) -> str:
    """What the engine does when the flag is not given, in words."""
    if field.metadata["default_text"]:
        return field.metadata["default_text"]
    if field.default is None:
        return "unset"
    if isinstance(field.default, bool):
        return "on" if field.default else "off"
    return str(field.default)


def _option(field: dataclasses.Field) -> inspect.Parameter:
    meta = field.metadata
    name = flag_name(field)
    shorts = [meta["short"]] if meta["short"] else []
    kind = _value_type(field)
    extra: dict[str, Any] = {}
    if _is_switch(field):
        option = typer.Option(False, name, *shorts, help=meta["help"] + ".", show_default=False, rich_help_panel=PANEL)
        return inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=bool)
    annotation: Any
    if kind is bool:
        annotation, decls = Optional[bool], [f"{name}/--no-{name[2:]}", *shorts]
    elif meta["parse"] is not None:
        annotation, decls = Optional[str], [name, *shorts]
        extra["metavar"] = {
            "bytes": "SIZE", "graph_sizes": "SIZES", "quantization": "METHOD", "json": "JSON", "int_list": "N,N,...",
        }[meta["parse"]]
    elif meta["choices"] is not None:
        annotation, decls = Optional[Literal[tuple(meta["choices"])]], [name, *shorts]
    elif kind in (int, float, str):
        annotation, decls = Optional[kind], [name, *shorts]
    else:
        raise ValueError(f"EngineArgs.{field.name} is a {kind}, which no command-line option reads; give it parse=... or cli=False")
    option = typer.Option(
        None, *decls, help=f"{meta['help']} (default: {default_text(field)}).", show_default=False, rich_help_panel=PANEL, **extra
    )
    return inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)


def engine_options(exclude: Iterable[str] = ()) -> list[inspect.Parameter]:
    """One typer option per engine flag (see the module docstring), as signature parameters."""
    return [_option(f) for f in engine_fields(exclude)]


def with_engine_flags(*, exclude: Iterable[str] = ()) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a typer command every engine flag but those in ``exclude``; the command receives the
    flags that were given as one parameter, ``engine_kwargs`` (``EngineArgs`` keywords)."""
    options = engine_options(exclude)
    return lambda func: add_flag_group(func, "engine_kwargs", options, engine_flag_kwargs)


def engine_flag_kwargs(**flags: Any) -> dict[str, Any]:
    """The engine flags given on a command line as ``EngineArgs`` keyword arguments: ``None`` and
    an unset switch are left out, ``parse`` fields are parsed (``--kv-cache-memory 2GiB``,
    ``--cuda-graph-sizes 1,2,4`` or ``none``, which turns decode graphs off)."""
    fields = {f.name: f for f in dataclasses.fields(EngineArgs)}
    kwargs: dict[str, Any] = {}
    for name, value in flags.items():
        field = fields.get(name)
        if field is None:
            raise ValueError(f"{name!r} is not an engine flag; the engine flags are {', '.join(sorted(fields))}")
        if value is None or (value is False and _is_switch(field)):
            continue
        parse = field.metadata["parse"]
        kwargs.update(_PARSERS[parse](field, value) if parse else {name: value})
    return kwargs


def _parse_bytes(field: dataclasses.Field, value: str) -> dict[str, Any]:
    """``2GiB`` / ``512MiB`` / ``1.5GB`` / a plain byte count."""
    units = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9, "b": 1}
    text = value.strip().lower()
    for suffix, mult in units.items():
        if text.endswith(suffix):
            number = text[: -len(suffix)].strip()
            break
    else:
        number, mult = text, 1
    try:
        return {field.name: int(float(number) * mult)}
    except ValueError:
        raise typer.BadParameter(
            f"{value!r} is not a size; use e.g. 2GiB, 512MiB or a byte count", param_hint=flag_name(field)
        ) from None


def _parse_graph_sizes(field: dataclasses.Field, value: str) -> dict[str, Any]:
    """``1,2,4,8`` (or spaces) is a list of batch sizes; ``none`` / ``off`` / ``0`` / empty turns
    decode graphs off (``cuda_graphs=False``)."""
    text = value.strip().lower()
    if text in ("", "none", "off", "0"):
        return {"cuda_graphs": False}
    try:
        return {field.name: [int(x) for x in text.replace(" ", ",").split(",") if x]}
    except ValueError:
        raise typer.BadParameter(
            f"{value!r} is not a list of batch sizes; use e.g. 1,2,4,8 or none", param_hint=flag_name(field)
        ) from None


def _parse_int_list(field: dataclasses.Field, value: str) -> dict[str, Any]:
    """``10,14`` (or spaces): a list of integers."""
    try:
        return {field.name: [int(x) for x in value.replace(" ", ",").split(",") if x]}
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not a list of integers; use e.g. 10,14", param_hint=flag_name(field)) from None


def _parse_quantization(field: dataclasses.Field, value: str) -> dict[str, Any]:
    """A registered quantization method (third-party ones included: the ``host.quantization`` group
    is loaded here to list them) or ``none``."""
    from host.core.models.quant_plan import registered_methods

    names = registered_methods()
    text = value.strip()
    if text.lower() == "none":
        return {field.name: "none"}
    if text not in names:
        raise typer.BadParameter(
            f"{value!r} is not a registered quantization method; choose one of {', '.join(sorted(names)) or '(none registered)'} "
            "or none (host plugins list shows the host.quantization plugins)",
            param_hint=flag_name(field),
        )
    return {field.name: text}


def _parse_json(field: dataclasses.Field, value: str) -> dict[str, Any]:
    import json

    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"{value!r} is not JSON ({exc})", param_hint=flag_name(field)) from None
    if not isinstance(parsed, dict):
        raise typer.BadParameter(f"{value!r} must be a JSON object", param_hint=flag_name(field))
    from host.core.entrypoints.cli.nested_configs import NestedConfigError, check_config_keys

    try:
        check_config_keys(flag_name(field), parsed)
    except NestedConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint=flag_name(field)) from None
    return {field.name: parsed}


_PARSERS: dict[str, Callable[[dataclasses.Field, str], dict[str, Any]]] = {
    "bytes": _parse_bytes,
    "graph_sizes": _parse_graph_sizes,
    "quantization": _parse_quantization,
    "json": _parse_json,
    "int_list": _parse_int_list,
}


def flag_cell(field: dataclasses.Field) -> str:
    if not field.metadata["cli"]:
        return ""
    name = flag_name(field)
    if _value_type(field) is bool and not _is_switch(field):
        name = f"--[no-]{name[2:]}"
    spellings = [field.metadata["short"], name] if field.metadata["short"] else [name]
    return ", ".join(f"`{s}`" for s in spellings)


def flag_table() -> str:
    """The markdown table of every ``EngineArgs`` field: keyword, flag, default, meaning."""
    rows = ["| keyword | flag | default | meaning |", "|---|---|---|---|"]
    for field in dataclasses.fields(EngineArgs):
        meaning = field.metadata["help"]
        if field.metadata["choices"]:
            meaning += ": " + ", ".join(f"`{c}`" for c in field.metadata["choices"])
        default = default_text(field)
        if isinstance(field.default, str) and not field.metadata["default_text"]:
            default = f"`{default}`"
        rows.append(f"| `{field.name}` | {flag_cell(field)} | {default} | {meaning} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(flag_table(), end="")
