"""vLLM's spellings of nested config flags, rewritten into one JSON value per config before click
parses a command line.

vLLM takes a config flag whose value is a JSON object in three forms, which may be mixed:

- the JSON form: ``--compilation-config '{"mode": 3}'``;
- the dotted form: ``--compilation-config.mode 3``, ``--structured-outputs-config.backend=xgrammar``,
  ``--speculative-config.method ngram``; a key path of several parts (``--x-config.a.b 1``) is a
  nested object; the value is JSON when it parses as JSON (``3``, ``true``, ``[1,2,4]``) and the
  text otherwise (``xgrammar``); ``--x-config.key+ a,b`` appends ``["a", "b"]`` to a list;
- ``-O``, which is the compilation config as well as the optimization level: ``-O.cudagraph_mode=FULL``
  is ``--compilation-config.cudagraph_mode FULL``, ``-O '{"mode": 3}'`` is ``--compilation-config``,
  while ``-O3``, ``-O 3`` and ``-O=3`` are the level (``-O 3``).

:func:`rewrite_nested_args` folds every form of a config into ONE ``--x-config JSON`` pair, at the
place of its first occurrence: the JSON forms merged in order, then the dotted keys merged over
them (objects key by key, lists appended to, anything else replaced). It also takes vLLM's
underscore spellings of an option (``--max_model_len``, ``--structured_outputs_config.backend``).
Options are rewritten only for the configs the command has, so ``host generate
--structured-outputs-config.backend x`` stays an unknown option. What each config's keys mean to
host is :mod:`.nested_configs`.
"""

from __future__ import annotations

import json
from typing import Any

NESTED_CONFIG_OPTIONS = (
    "--compilation-config", "--structured-outputs-config", "--speculative-config", "--kv-transfer-config",
    "--pooler-config", "--quantization-config",
)
"""The options whose value is a JSON object, so that take the dotted form where a command has them."""


class NestedArgsError(ValueError):
    """A nested config flag that cannot be folded (no value, bad JSON, not an object)."""


def parse_value(text: str) -> Any:
    """A dotted key's value: JSON when it parses as JSON (``3``, ``true``, ``[1,2]``, ``"x"``), else the text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def merge(into: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """``update`` merged into ``into`` (which is changed and returned): objects key by key, lists
    appended to, anything else replaced."""
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        elif isinstance(value, list) and isinstance(into.get(key), list):
            into[key] = into[key] + value
        else:
            into[key] = value
    return into


def _nested(path: list[str], value: Any) -> dict[str, Any]:
    for key in reversed(path[1:]):
        value = {key: value}
    return {path[0]: value}


def _dashed(name: str) -> str:
    """``--max_model_len`` -> ``--max-model-len`` (the leading dashes kept)."""
    return "--" + name[2:].replace("_", "-")


class _Config:
    """The forms of one config seen so far, and where the first one was."""

    def __init__(self, option: str, position: int) -> None:
        self.option = option
        self.position = position
        self.json_forms: list[str] = []
        self.dotted: list[tuple[str, list[str], Any]] = []  # (as typed, key path, value)

    def value(self) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for text in self.json_forms:
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError as exc:
                raise NestedArgsError(f"{self.option} {text!r} is not JSON ({exc}); pass a JSON object, e.g. "
                                      f"{self.option} '{{\"key\": \"value\"}}', or the dotted form {self.option}.key value") from None
            if not isinstance(parsed, dict):
                raise NestedArgsError(f"{self.option} {text!r} must be a JSON object, e.g. {self.option} '{{\"key\": \"value\"}}'")
            merge(merged, parsed)
        for _, path, value in self.dotted:
            merge(merged, _nested(path, value))
        return merged


def rewrite_nested_args(args: list[str], options: dict[str, bool]) -> list[str]:
    """``args`` with every nested config flag folded into one ``--x-config JSON`` pair (see the
    module). ``options`` maps each option spelling of the command to whether it takes a value
    (so a value that looks like an option is never rewritten). A dotted flag without a value, or
    JSON that is not an object, is a :class:`NestedArgsError`."""
    nested = {name for name in NESTED_CONFIG_OPTIONS if name in options}
    out: list[str] = []
    configs: dict[str, _Config] = {}

    def config(option: str) -> _Config:
        if option not in configs:
            configs[option] = _Config(option, len(out))
            out.extend([option, ""])  # filled in at the end
        return configs[option]

    def take_value(i: int, shown: str) -> tuple[str, int]:
        if i + 1 >= len(args):
            raise NestedArgsError(f"{shown} needs a value, e.g. {shown} VALUE or {shown}=VALUE")
        return args[i + 1], i + 2

    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            out.extend(args[i:])
            break
        name, eq, inline = arg.partition("=")
        compilation = "--compilation-config" in nested
        if compilation and arg.startswith("-O") and not arg.startswith("--"):
            rest = arg[2:]
            if rest.startswith("."):  # -O.key value / -O.key=value: the compilation config
                name, eq, inline = ("--compilation-config" + rest).partition("=")
            elif rest.removeprefix("=").lstrip().startswith("{"):  # -O'{...}' / -O={...}: the JSON form
                config("--compilation-config").json_forms.append(rest.removeprefix("="))
                i += 1
                continue
            elif rest.startswith("="):  # -O=3: the level
                out.extend(["-O", rest[1:]])
                i += 1
                continue
            elif rest == "" and i + 1 < len(args) and args[i + 1].lstrip().startswith("{"):
                config("--compilation-config").json_forms.append(args[i + 1])
                i += 2
                continue
        if name.startswith("--") and "." in name:
            base, _, path = name.partition(".")
            option = base if base in nested else _dashed(base)
            if option in nested:
                if eq:
                    text, i = inline, i + 1
                else:
                    text, i = take_value(i, name)
                append = path.endswith("+")
                keys = path.rstrip("+").split(".")
                if not all(keys):
                    raise NestedArgsError(f"{name} names an empty key; use {option}.KEY VALUE")
                value: Any = [parse_value(t) for t in text.split(",")] if append else parse_value(text)
                config(option).dotted.append((name, keys, value))
                continue
        if name.startswith("--") and name not in options and _dashed(name) in options:
            name = _dashed(name)
            arg = name + eq + inline
        if name in nested:
            if eq:
                config(name).json_forms.append(inline)
                i += 1
            else:
                text, i = take_value(i, name)
                config(name).json_forms.append(text)
            continue
        out.append(arg)
        i += 1
        if not eq and options.get(name) and i < len(args):
            out.append(args[i])  # the option's value, as it is
            i += 1
    for cfg in configs.values():
        out[cfg.position + 1] = json.dumps(cfg.value())
    return out
