"""A Responses request as the chat route's request: its items become chat messages, its tools,
``tool_choice`` and ``text.format`` the chat fields, so the prompt is rendered by the same chat
template and the output read by the same tool and reasoning parsers (:mod:`.chat`).

- :func:`input_items` checks ``input`` item by item and returns it as a list of items (a string
  is one user message); a bad item is a 400 naming it (``input[1].call_id``);
- :func:`chat_messages` turns items into chat messages: ``instructions`` a leading system
  message, ``developer`` messages system ones, text parts joined, consecutive ``function_call``
  items one assistant turn's ``tool_calls`` (joined to the assistant message just before them),
  ``function_call_output`` a ``tool`` message; ``reasoning`` items are left out of the prompt,
  as chat templates leave out earlier turns' reasoning;
- :func:`chat_request` builds the :class:`ChatCompletionRequest`.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from host.plugins.endpoints.protocol import ChatCompletionRequest
from host.plugins.endpoints.responses_protocol import CHAT_EXTENSIONS, ResponsesRequest
from host.sdk import APIError

MESSAGE_ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text")
ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")


def _bad(where: str, message: str) -> APIError:
    return APIError(400, f"{where}: {message}", param=where)


def _text(value: Any, where: str) -> str:
    """A string, or the text of a list of text parts (``input_text``, ``output_text``)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise _bad(where, "must be a string or a list of text parts")
    out = []
    for j, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            out.append(part["refusal"])
            continue
        if kind not in TEXT_PARTS:
            raise _bad(f"{where}[{j}]", f"a part of type {kind!r} is not supported; this server reads text parts "
                       "(input_text, output_text)")
        if not isinstance(part.get("text"), str):
            raise _bad(f"{where}[{j}].text", "must be a string")
        out.append(part["text"])
    return "".join(out)


def _string(item: dict[str, Any], key: str, where: str, required: bool = True) -> str | None:
    value = item.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value):
        raise _bad(f"{where}.{key}", "must be a non-empty string" if required else "must be a string")
    return value


def input_items(value: str | list[Any]) -> list[dict[str, Any]]:
    """``input`` as checked items (each a dict with its ``type``); a string is one user message."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not value:
        raise _bad("input", "must not be empty")
    items = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(where, "must be an object (a message or an item with a type)")
        kind = item.get("type", "message" if "role" in item else None)
        if kind not in ITEM_TYPES:
            raise _bad(f"{where}.type", f"{kind!r} is not supported; this server takes {', '.join(ITEM_TYPES)}")
        if kind == "message":
            if item.get("role") not in MESSAGE_ROLES:
                raise _bad(f"{where}.role", f"{item.get('role')!r} is not one of {', '.join(MESSAGE_ROLES)}")
            _text(item.get("content"), f"{where}.content")
        elif kind == "function_call":
            for key in ("name", "call_id"):
                _string(item, key, where)
            if not isinstance(item.get("arguments"), str):
                raise _bad(f"{where}.arguments", "must be a string (the call's arguments as JSON)")
        elif kind == "function_call_output":
            _string(item, "call_id", where)
            _text(item.get("output"), f"{where}.output")
        items.append({**item, "type": kind})
    return items


def chat_messages(items: list[dict[str, Any]], instructions: str | None) -> list[dict[str, Any]]:
    """The chat messages of checked ``items`` (see the module's docstring)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    for item in items:
        kind = item["type"]
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": _text(item["content"], "input")})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": _text(item["output"], "input")})
    if not messages:
        raise _bad("input", "holds no message, function call or function call output to answer (reasoning items alone are no prompt)")
    return messages


def chat_tools(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    """Responses' function tools (``{"type": "function", "name", "description", "parameters"}``)
    as chat's; any other tool type is a 400 naming it."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise _bad(f"{where}.type", f"{kind!r} is not supported; this server runs function tools "
                       '({"type": "function", "name": ..., "parameters": ...})')
        _string(tool, "name", where)
        parameters = tool.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise _bad(f"{where}.parameters", "must be a JSON schema object")
        description = _string(tool, "description", where, required=False)
        function: dict[str, Any] = {"name": tool["name"], "parameters": parameters or {"type": "object", "properties": {}}}
        if description is not None:
            function["description"] = description
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """``"auto"``, ``"none"``, ``"required"`` as they are; ``{"type": "function", "name": N}`` as
    chat's named choice; other forms (hosted tools, ``allowed_tools``) are a 400."""
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise _bad("tool_choice", 'must be "auto", "none", "required" or {"type": "function", "name": ...}')
    return {"type": "function", "function": {"name": choice["name"]}}


def chat_request(body: ResponsesRequest, items: list[dict[str, Any]], stream: bool) -> ChatCompletionRequest:
    """The chat request that generates ``body``'s response over the conversation ``items``."""
    fmt = body.format
    choice = chat_tool_choice(body.tool_choice)
    if fmt is not None and fmt.type != "text" and (choice == "required" or isinstance(choice, dict)):
        raise _bad("text.format", "a JSON format cannot be combined with a required or named tool_choice, "
                   "which is enforced with a JSON schema of its own; drop one of them")
    fields: dict[str, Any] = {
        "messages": chat_messages(items, body.instructions),
        "model": body.model,
        "tools": chat_tools(body.tools),
        "tool_choice": choice,
        "parallel_tool_calls": body.parallel_tool_calls,
        "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "stream": stream,
        "user": body.user,
        **{name: getattr(body, name) for name in CHAT_EXTENSIONS},
    }
    if fmt is not None and fmt.type != "text":
        fields["response_format"] = (
            {"type": "json_object"} if fmt.type == "json_object"
            else {"type": "json_schema", "json_schema": {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict}}
        )
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:  # the fields were checked as the Responses body; a guard, named
        error = exc.errors()[0]
        where = ".".join(str(x) for x in error.get("loc", ()))
        raise APIError(400, f"{where}: {error.get('msg', 'invalid')}", param=where or None) from None
