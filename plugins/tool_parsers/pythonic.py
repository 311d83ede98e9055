"""``pythonic``: calls as a Python list of function calls, ``[get_weather(city='Paris'), f(x=1)]``
(Llama 3.2 / 4 style, optionally inside ``<|python_start|>...<|python_end|>``). The text is read
with :mod:`ast` and each keyword value with ``ast.literal_eval``: nothing is ever evaluated.
Positional arguments, or anything but literals, make the output plain content."""

from __future__ import annotations

import ast
import json
from typing import Any

from host.sdk import ExtractedToolCalls, PartialToolCalls, ToolCall, ToolParser
from host.sdk.tool_parser import arguments_json

START, END = "<|python_start|>", "<|python_end|>"
_JSON_NAMES = {"true": True, "false": False, "null": None}


def _value(node: ast.AST) -> Any:
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_value(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("** in a dict literal")
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values)}  # type: ignore[arg-type]
    return ast.literal_eval(node)


def _func_name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_func_name(node.value)}.{node.attr}"
    raise ValueError("not a function name")


def _call(node: ast.AST) -> ToolCall:
    if not isinstance(node, ast.Call) or node.args or any(k.arg is None for k in node.keywords):
        raise ValueError("not a call with keyword arguments only")
    arguments = {k.arg: _value(k.value) for k in node.keywords}
    json.dumps(arguments, allow_nan=False)  # 1e999 reads as inf, which no JSON reader takes: ValueError
    return ToolCall(_func_name(node.func), arguments_json(arguments))


def _body(text: str) -> str:
    body = text.strip()
    if body.startswith(START):
        body = body[len(START):]
    if body.endswith(END):
        body = body[: -len(END)]
    return body.strip()


def _parse(body: str) -> list[ToolCall] | None:
    try:
        tree = ast.parse(body, mode="eval").body
    except (SyntaxError, ValueError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    try:
        return [_call(e) for e in tree.elts]
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return None


def _top_level_items(body: str) -> tuple[list[str], str]:
    """The complete top-level items of an unfinished list ``[a(...), b(...`` and the unfinished rest."""
    items, depth, quote, start, i = [], 0, "", 1, 1
    while i < len(body):
        ch = body[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(body[start:i])
            start = i + 1
        i += 1
    return items, body[start:i]


class PythonicToolParser(ToolParser):
    name = "pythonic"

    def extract(self, text: str, tools: list[dict[str, Any]] | None = None) -> ExtractedToolCalls:
        body = _body(text)
        calls = _parse(body) if body.startswith("[") else None
        if not calls:
            return ExtractedToolCalls(text, [])
        return ExtractedToolCalls(None, calls)

    def parse_partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> PartialToolCalls:
        stripped = text.lstrip()
        if not stripped or START.startswith(stripped):
            return PartialToolCalls()
        body = stripped[len(START):].lstrip() if stripped.startswith(START) else stripped
        if not body:
            return PartialToolCalls()
        if not body.startswith("["):
            return PartialToolCalls(text)
        items, rest = _top_level_items(body)
        calls: list[tuple[str, str | None]] = []
        for item in items:
            parsed = _parse(f"[{item}]")
            if not parsed:
                return PartialToolCalls(calls=calls)
            calls.append((parsed[0].name, parsed[0].arguments))
        return PartialToolCalls(calls=calls)  # the last call is announced once the list is complete
