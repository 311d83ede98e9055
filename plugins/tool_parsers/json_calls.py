"""What the JSON-based tool parsers share: reading ``{"name": ..., "arguments": ...}`` objects,
and sequences of JSON values."""

from __future__ import annotations

import json
from typing import Any

from host.sdk import ToolCall
from host.sdk.tool_parser import arguments_json

_DECODER = json.JSONDecoder()


def call_from_object(obj: Any, argument_keys: tuple[str, ...] = ("arguments", "parameters")) -> ToolCall | None:
    """The call a decoded JSON object states, or ``None`` when it is not one (no string
    ``name``, or arguments that are not an object)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments: Any = {}
    for key in argument_keys:
        if key in obj:
            arguments = obj[key]
            break
    if isinstance(arguments, str):  # some models send the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(obj["name"], arguments_json(arguments))


def decode_sequence(text: str, separator: str = "") -> tuple[list[Any], str]:
    """The JSON values at the start of ``text``, one after another (whitespace and, if given,
    ``separator`` between them), and the rest of ``text`` that did not decode."""
    values, pos = [], 0
    while True:
        while pos < len(text) and (text[pos].isspace() or (separator and text.startswith(separator, pos))):
            pos += 1
        if pos >= len(text):
            return values, ""
        try:
            value, pos = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError:
            return values, text[pos:]
        values.append(value)
