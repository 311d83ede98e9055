"""``qwen3_coder``: Qwen3-Coder's XML calls, one block per call::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Parameter values are raw text (the chat template writes one newline after ``<parameter=NAME>`` and
one before ``</parameter>``; those are not part of the value), typed by the tool's JSON schema
from the request's ``tools``: ``integer`` / ``number`` / ``boolean`` / ``null`` are read as such,
``object`` / ``array`` as JSON (or a Python literal, never evaluated), anything else, an unknown
parameter, or a value that does not read as its type, stays a string. A ``<function=...>`` block
without the ``<tool_call>`` wrapper is read too. Text before the first block is content; an
output whose blocks do not all parse is all content. A ``</parameter>`` counts as the end of a
value only when the next thing after it is another parameter or ``</function>``, so a value may
contain the tag itself (code that writes XML)."""

from __future__ import annotations

import ast
import json
import math
from typing import Any

from host.sdk import ExtractedToolCalls, PartialToolCalls, ToolCall, ToolParser
from host.sdk.tool_parser import arguments_json, hold_back_prefix

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"


def parameter_schemas(tools: list[dict[str, Any]] | None, name: str) -> dict[str, Any] | None:
    """The ``properties`` of the tool called ``name`` (``None`` when the request has no such tool)."""
    for tool in tools or []:
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name") == name:
            parameters = function.get("parameters") or {}
            properties = parameters.get("properties") if isinstance(parameters, dict) else None
            return properties if isinstance(properties, dict) else {}
    return None


_ALIASES = {"int": "integer", "long": "integer", "float": "number", "double": "number", "bool": "boolean",
            "str": "string", "text": "string", "dict": "object", "list": "array"}


def _kind(name: Any) -> str:
    """A schema type name, with the names tools written for Python use (``int``, ``float``, ...)."""
    name = str(name).strip().lower()
    return _ALIASES.get(name, name)


def _types(schema: Any) -> list[str]:
    """The JSON types a parameter's schema admits, in order (``type``, a list of them, or the
    branches of ``anyOf`` / ``oneOf``)."""
    if not isinstance(schema, dict):
        return []
    kind = schema.get("type")
    if isinstance(kind, str):
        return [_kind(kind)]
    if isinstance(kind, list):
        return [_kind(k) for k in kind]
    out: list[str] = []
    for key in ("anyOf", "oneOf"):
        for branch in schema.get(key) or []:
            out.extend(_types(branch))
    return out


def _as_container(text: str, kind: type) -> Any:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        try:
            value = ast.literal_eval(text)  # a Python literal ({'k': 'v'}); never evaluated
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return None
    if not isinstance(value, kind):
        return None
    try:
        json.dumps(value, allow_nan=False)  # a Python literal may hold bytes, sets, inf
    except (TypeError, ValueError):
        return None
    return value


def typed_value(text: str, schema: Any) -> Any:
    """``text`` as the first of the schema's types it reads as; a string otherwise."""
    for kind in _types(schema):
        if kind == "string":
            return text
        if kind == "null" and text.strip().lower() in ("null", "none"):
            return None
        if kind == "integer":
            try:
                return int(text.strip())
            except ValueError:
                pass
        if kind == "number":
            try:
                number = float(text.strip())
            except ValueError:
                continue
            if math.isfinite(number):
                return int(number) if number.is_integer() and "." not in text and "e" not in text.lower() else number
        if kind == "boolean" and text.strip().lower() in ("true", "false"):
            return text.strip().lower() == "true"
        if kind in ("object", "array"):
            value = _as_container(text.strip(), dict if kind == "object" else list)
            if value is not None:
                return value
    return text


def _value_end(body: str, start: int) -> int:
    """Where the value starting at ``start`` ends: the first ``</parameter>`` followed (after
    whitespace) by another parameter or ``</function>``; -1 when there is none yet."""
    pos = start
    while True:
        end = body.find(PARAMETER_END, pos)
        if end < 0:
            return -1
        after = body[end + len(PARAMETER_END):].lstrip()
        if after.startswith(PARAMETER) or after.startswith(FUNCTION_END):
            return end
        pos = end + 1


def _strip_newlines(value: str) -> str:
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def _function(text: str, pos: int, tools: list[dict[str, Any]] | None) -> tuple[ToolCall, int] | None:
    """The ``<function=NAME>...</function>`` starting at ``pos`` and the index after it, or
    ``None`` when it is malformed or not finished."""
    name_end = text.find(">", pos)
    if name_end < 0:
        return None
    name = text[pos + len(FUNCTION): name_end].strip()
    if not name or "\n" in name or "<" in name:
        return None
    schemas = parameter_schemas(tools, name)
    arguments: dict[str, Any] = {}
    pos = name_end + 1
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if text.startswith(FUNCTION_END, pos):
            return ToolCall(name, arguments_json(arguments)), pos + len(FUNCTION_END)
        if not text.startswith(PARAMETER, pos):
            return None
        key_end = text.find(">", pos)
        if key_end < 0:
            return None
        key = text[pos + len(PARAMETER): key_end].strip()
        end = _value_end(text, key_end + 1)
        if not key or "\n" in key or end < 0:
            return None
        raw = _strip_newlines(text[key_end + 1: end])
        arguments[key] = typed_value(raw, (schemas or {}).get(key)) if schemas is not None else raw
        pos = end + len(PARAMETER_END)


def _next_block(text: str, pos: int) -> int:
    """The start of the next call block (``<tool_call>`` or a bare ``<function=``) from ``pos``."""
    starts = [i for i in (text.find(OPEN, pos), text.find(FUNCTION, pos)) if i >= 0]
    return min(starts) if starts else -1


def _calls(text: str, start: int, tools: list[dict[str, Any]] | None) -> tuple[list[ToolCall], bool]:
    """The complete blocks from ``start`` on, and whether the text after the last one holds no
    further (unfinished or malformed) block."""
    calls: list[ToolCall] = []
    pos = start
    while True:
        begin = _next_block(text, pos)
        if begin < 0:
            return calls, True
        wrapped = text.startswith(OPEN, begin)
        inner = begin + len(OPEN) if wrapped else begin
        while inner < len(text) and text[inner].isspace():
            inner += 1
        if not text.startswith(FUNCTION, inner):
            return calls, False
        parsed = _function(text, inner, tools)
        if parsed is None:
            return calls, False
        call, pos = parsed
        if wrapped:
            rest = text[pos:].lstrip()
            if rest.startswith(CLOSE):
                pos = len(text) - len(rest) + len(CLOSE)
            elif rest:  # something else before the block's end
                return calls, False
        calls.append(call)


class Qwen3CoderToolParser(ToolParser):
    name = "qwen3_coder"

    def extract(self, text: str, tools: list[dict[str, Any]] | None = None) -> ExtractedToolCalls:
        start = _next_block(text, 0)
        if start < 0:
            return ExtractedToolCalls(text, [])
        calls, whole = _calls(text, start, tools)
        if not whole or not calls:
            return ExtractedToolCalls(text, [])  # malformed: all of it is content
        return ExtractedToolCalls(text[:start] or None, calls)

    def parse_partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> PartialToolCalls:
        start = _next_block(text, 0)
        if start < 0:
            return PartialToolCalls(hold_back_prefix(hold_back_prefix(text, OPEN), FUNCTION))
        calls, _ = _calls(text, start, tools)
        # a call is announced once its </function> is there, so a malformed one stays content;
        # the last one waits for what follows it (a stray </parameter> may still extend a value)
        complete = [(c.name, c.arguments) for c in calls]
        return PartialToolCalls(text[:start], complete[:-1] if complete and not _closed(text) else complete)


def _closed(text: str) -> bool:
    """Whether the text ends with a finished block (nothing can change the last call)."""
    return text.rstrip().endswith(CLOSE)
