"""Tool calling on the chat route: ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` checked
against each other and the server's flags, and the parser each ``tool_choice`` uses.

- ``"none"``: no parsing (the tools may still be in the prompt);
- ``"auto"``: the ``--tool-call-parser`` plugin reads the output (needs
  ``--enable-auto-tool-choice``); the default when tools are given and the server enables it;
- ``"required"`` and ``{"type": "function", "function": {"name": ...}}``: enforced with
  structured outputs, so any model answers with schema-valid calls. ``"required"`` asks for a
  JSON array (at least one item) of ``{"name": <one tool's name>, "parameters": <its
  parameters>}``; a named function for that function's parameters object alone.

Every inconsistency is an :class:`host.sdk.APIError` 400 naming the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from host.sdk import APIError, ExtractedToolCalls, PartialToolCalls, ToolCall, ToolParser
from host.sdk.tool_parser import arguments_json, decode_sequence

AUTO_NEEDS_FLAGS = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass
class ToolChoice:
    """What a request's tool fields resolved to: ``mode`` (``none``, ``auto``, ``required``,
    ``named``), the named function, and the JSON schema structured outputs enforce."""

    mode: str
    tools: list[dict[str, Any]] | None
    function: str | None = None
    schema: dict[str, Any] | None = None
    parallel: bool = True


def tool_functions(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{name: parameters schema}`` of ``tools``; a 400 names a malformed entry."""
    out: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise APIError(400, f'tools[{i}] must be {{"type": "function", "function": {{"name": ..., "parameters": ...}}}}', param="tools")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise APIError(400, f"tools[{i}].function.name must be a non-empty string", param="tools")
        parameters = fn.get("parameters")
        if parameters is None:
            parameters = EMPTY_PARAMETERS
        if not isinstance(parameters, dict):
            raise APIError(400, f"tools[{i}].function.parameters must be a JSON schema object", param="tools")
        out[name] = parameters
    return out


def required_schema(functions: dict[str, dict[str, Any]], parallel: bool) -> dict[str, Any]:
    """A JSON array of calls, each ``{"name": const, "parameters": that tool's schema}``."""
    items = [
        {
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [name]}, "parameters": parameters},
            "required": ["name", "parameters"],
        }
        for name, parameters in functions.items()
    ]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": items[0] if len(items) == 1 else {"anyOf": items}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def resolve_tool_choice(body: Any, settings: Any, has_parser: bool) -> ToolChoice:
    """The request's :class:`ToolChoice`; a 400 for an inconsistent combination."""
    tools, choice = body.tools, body.tool_choice
    parallel = body.parallel_tool_calls is not False
    if tools is not None and not isinstance(tools, list):
        raise APIError(400, "tools must be a list", param="tools")
    functions = tool_functions(tools) if tools else {}
    if choice is None:
        auto = bool(functions) and settings.enable_auto_tool_choice and has_parser
        return ToolChoice("auto" if auto else "none", tools or None, parallel=parallel)
    if choice != "none" and not functions:
        raise APIError(400, "When using `tool_choice`, `tools` must be set.", param="tool_choice")
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise APIError(400, f'tool_choice={choice!r} is not one of "none", "auto", "required" or a named function', param="tool_choice")
        if choice == "auto" and not (settings.enable_auto_tool_choice and has_parser):
            raise APIError(400, AUTO_NEEDS_FLAGS, param="tool_choice")
        if choice != "required":
            return ToolChoice(choice, tools or None, parallel=parallel)
        _no_other_constraint(body, "required")
        return ToolChoice("required", tools, schema=required_schema(functions, parallel), parallel=parallel)
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if choice.get("type") != "function" or not isinstance(name, str):
        raise APIError(400, 'a named tool_choice must be {"type": "function", "function": {"name": ...}}', param="tool_choice")
    if name not in functions:
        raise APIError(
            400, f"tool_choice names the function {name!r}, which is not among tools ({', '.join(functions)})", param="tool_choice"
        )
    _no_other_constraint(body, "a named function")
    return ToolChoice("named", tools, function=name, schema=functions[name], parallel=parallel)


def _no_other_constraint(body: Any, what: str) -> None:
    rf = body.response_format
    if body.structured_outputs is not None or (rf is not None and rf.type != "text") or any(
        getattr(body, f) is not None for f in ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
    ):
        raise APIError(
            400,
            f"tool_choice {what} is enforced with structured outputs and cannot be combined with response_format, "
            "structured_outputs or guided_*; drop one of them",
            param="tool_choice",
        )


class NamedFunctionParser(ToolParser):
    """The output of a named ``tool_choice``: the function's arguments object, nothing else.
    Streamed, the arguments go out as the text grows (it is the JSON itself)."""

    name = "named_function"

    def __init__(self, function: str) -> None:
        super().__init__(None)
        self.function = function

    def extract(self, text: str, tools: list[dict[str, Any]] | None = None) -> ExtractedToolCalls:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return ExtractedToolCalls(text, [])  # cut short (max_tokens): not a call
        if not isinstance(value, dict):
            return ExtractedToolCalls(text, [])
        return ExtractedToolCalls(None, [ToolCall(self.function, text.strip())])

    def parse_partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> PartialToolCalls:
        return PartialToolCalls(calls=[(self.function, text.strip() or None)])


class RequiredCallsParser(ToolParser):
    """The output of ``tool_choice="required"``: a JSON array of ``{"name", "parameters"}``."""

    name = "required_calls"

    def extract(self, text: str, tools: list[dict[str, Any]] | None = None) -> ExtractedToolCalls:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return ExtractedToolCalls(text, [])
        calls = [_required_call(v) for v in value] if isinstance(value, list) else []
        if not calls or any(c is None for c in calls):
            return ExtractedToolCalls(text, [])
        return ExtractedToolCalls(None, calls)  # type: ignore[arg-type]

    def parse_partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> PartialToolCalls:
        start = text.find("[")
        if start < 0:
            return PartialToolCalls()
        values, _ = decode_sequence(text[start + 1:], ",")  # the complete calls so far
        calls: list[tuple[str, str | None]] = []
        for value in values:
            call = _required_call(value)
            if call is None:
                break
            calls.append((call.name, call.arguments))
        return PartialToolCalls(calls=calls)


def _required_call(value: Any) -> ToolCall | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not isinstance(value.get("parameters"), dict):
        return None
    return ToolCall(value["name"], arguments_json(value["parameters"]))
