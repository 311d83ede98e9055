"""Anthropic Messages request bodies (``POST /v1/messages`` and ``/v1/messages/count_tokens``) and
their translation to a :class:`ChatCompletionRequest`, so a Messages request is rendered,
constrained, sampled and parsed by exactly the chat route's machinery.

The translation, field by field (the schemas are those of Anthropic's ``anthropic`` client):

- ``system`` (a string, or text blocks joined by ``"\\n"``) becomes the first, ``system``, message;
- a message's ``content`` is a string or blocks: ``text`` blocks are joined by ``"\\n"``; an
  assistant's ``tool_use`` blocks become its ``tool_calls`` (``input`` as the arguments); a user's
  ``tool_result`` blocks become ``tool`` messages (``tool_call_id``; content a string or text
  blocks, prefixed ``"Error: "`` when ``is_error``), in the order of the blocks; ``thinking`` and
  ``redacted_thinking`` blocks of earlier assistant turns are dropped (chat templates drop past
  reasoning too); any other block (images, documents, server tools) is a 400 naming it;
- a final ``assistant`` message is continued (Anthropic's prefill: ``continue_final_message``);
- ``tools`` (``name``, ``description``, ``input_schema``) become function tools; a server tool
  (a ``type`` other than ``"custom"``) is a 400;
- ``tool_choice`` ``auto`` / ``any`` / ``tool`` (with ``name``) / ``none`` become chat's ``"auto"``
  / ``"required"`` / a named function / ``"none"`` (``any`` and ``tool`` are enforced by the
  structured-output grammar); ``disable_parallel_tool_use`` is ``parallel_tool_calls: false``;
- ``max_tokens`` (required, at least 1), ``stop_sequences``, ``temperature``, ``top_p``,
  ``top_k`` are the sampling fields; ``metadata``, ``thinking`` and the rest are ignored.

Every malformed value is an :class:`host.sdk.APIError` 400 naming its path
(``messages[2].content[0].tool_use_id``).
"""

from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import Field

from host.plugins.endpoints.protocol import ChatCompletionRequest, _Body
from host.sdk import APIError

SUPPORTED_BLOCKS = "text, tool_use (assistant) and tool_result (user)"


class CountTokensRequest(_Body):
    """``POST /v1/messages/count_tokens``: what the prompt is made of."""

    model: str
    messages: list[dict[str, Any]]
    system: Optional[Union[str, list[dict[str, Any]]]] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[dict[str, Any]] = None
    thinking: Optional[dict[str, Any]] = None  # accepted, no effect: a --reasoning-parser decides

    def chat_request(self, **sampling: Any) -> ChatCompletionRequest:
        """The chat request this body stands for, with ``sampling``'s chat fields added."""
        messages = chat_messages(self.messages)
        if self.system is not None:
            messages.insert(0, {"role": "system", "content": _system_text(self.system)})
        prefill = self.messages[-1].get("role") == "assistant"
        fields: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "add_generation_prompt": not prefill,
            "continue_final_message": prefill,
            **sampling,
        }
        if self.tools is not None:
            fields["tools"] = chat_tools(self.tools)
        if self.tool_choice is not None:
            fields["tool_choice"], parallel = chat_tool_choice(self.tool_choice)
            if not parallel:
                fields["parallel_tool_calls"] = False
        return ChatCompletionRequest.model_validate(fields)


class MessagesRequest(CountTokensRequest):
    """``POST /v1/messages``."""

    max_tokens: int = Field(ge=1)
    stop_sequences: Optional[list[str]] = None
    stream: bool = False
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    metadata: Optional[dict[str, Any]] = None  # accepted, no effect

    def chat_request(self, **sampling: Any) -> ChatCompletionRequest:
        fields = {"max_tokens": self.max_tokens, "stop": self.stop_sequences, "stream": self.stream,
                  "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}
        return super().chat_request(**{k: v for k, v in fields.items() if v is not None}, **sampling)


def _text_blocks(blocks: Any, where: str) -> str:
    """The text of a list of ``text`` blocks, joined by ``"\\n"``; a 400 naming any other."""
    parts = []
    for i, block in enumerate(blocks):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise APIError(400, f'{where}[{i}] must be a text block {{"type": "text", "text": "..."}}', param=where)
        parts.append(block["text"])
    return "\n".join(parts)


def _system_text(system: str | list[dict[str, Any]]) -> str:
    return system if isinstance(system, str) else _text_blocks(system, "system")


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    """A ``tool_result`` block as the chat ``tool`` message."""
    use_id = block.get("tool_use_id")
    if not isinstance(use_id, str) or not use_id:
        raise APIError(400, f"{where}.tool_use_id must be the id of the tool_use block it answers", param=f"{where}.tool_use_id")
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = _text_blocks(content, f"{where}.content")
    else:
        raise APIError(400, f"{where}.content must be a string or a list of text blocks", param=f"{where}.content")
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise APIError(400, f"{where}.is_error must be true or false", param=f"{where}.is_error")
    return {"role": "tool", "tool_call_id": use_id, "content": f"Error: {text}" if is_error else text}


def _tool_use(block: dict[str, Any], where: str) -> dict[str, Any]:
    """A ``tool_use`` block as a chat ``tool_calls`` entry."""
    for key in ("id", "name"):
        if not isinstance(block.get(key), str) or not block[key]:
            raise APIError(400, f"{where}.{key} must be a non-empty string", param=f"{where}.{key}")
    if not isinstance(block.get("input"), dict):
        raise APIError(400, f"{where}.input must be an object (the tool's arguments)", param=f"{where}.input")
    return {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": block["input"]}}


def chat_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages of Anthropic ``messages`` (see the module's docstring)."""
    if not messages:
        raise APIError(400, "messages must not be empty", param="messages")
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise APIError(400, f'{where} must be an object {{"role": ..., "content": ...}}', param=where)
        role = msg.get("role")
        if role not in ("user", "assistant"):
            raise APIError(400, f'{where}.role must be "user" or "assistant", not {role!r}; a system prompt goes in the '
                           'top-level "system" field', param=f"{where}.role")
        content = msg.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise APIError(400, f"{where}.content must be a string or a list of content blocks", param=f"{where}.content")
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        flushed = False  # a user message's text already went out before a tool_result
        for j, block in enumerate(content):
            at = f"{where}.content[{j}]"
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif kind == "text":
                raise APIError(400, f"{at}.text must be a string", param=f"{at}.text")
            elif kind == "tool_use" and role == "assistant":
                calls.append(_tool_use(block, at))
            elif kind == "tool_result" and role == "user":
                if texts:
                    out.append({"role": "user", "content": "\n".join(texts)})
                    texts, flushed = [], True
                out.append(_tool_result(block, at))
                flushed = True
            elif kind in ("thinking", "redacted_thinking") and role == "assistant":
                continue
            elif kind in ("tool_use", "tool_result", "thinking", "redacted_thinking"):
                raise APIError(400, f"{at}: a {kind} block cannot be in a {role} message", param=f"{at}.type")
            else:
                raise APIError(400, f"{at}.type {kind!r} is not supported; this server reads {SUPPORTED_BLOCKS} blocks",
                               param=f"{at}.type")
        if role == "assistant":
            out.append({"role": "assistant", "content": "\n".join(texts), **({"tool_calls": calls} if calls else {})})
        elif texts or not flushed:
            out.append({"role": "user", "content": "\n".join(texts)})
    if out[-1].get("tool_calls"):
        raise APIError(400, f"messages[{len(messages) - 1}] is an assistant message with tool_use blocks; answer them "
                       "with tool_result blocks in a user message after it", param="messages")
    return out


def chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Anthropic tools as chat function tools; a server tool or a malformed one is a 400."""
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise APIError(400, f"{where} must be an object with name, description and input_schema", param=where)
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise APIError(400, f"{where}.type {kind!r} is an Anthropic server tool, which this server does not run; "
                           "declare client tools with name, description and input_schema", param=f"{where}.type")
        name, schema, description = tool.get("name"), tool.get("input_schema"), tool.get("description")
        if not isinstance(name, str) or not name:
            raise APIError(400, f"{where}.name must be a non-empty string", param=f"{where}.name")
        if not isinstance(schema, dict):
            raise APIError(400, f"{where}.input_schema must be a JSON schema object", param=f"{where}.input_schema")
        if description is not None and not isinstance(description, str):
            raise APIError(400, f"{where}.description must be a string", param=f"{where}.description")
        function = {"name": name, **({"description": description} if description is not None else {}), "parameters": schema}
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: dict[str, Any]) -> tuple[str | dict[str, Any], bool]:
    """Chat's ``tool_choice`` of an Anthropic one, and whether parallel calls are allowed."""
    kind = choice.get("type")
    parallel = not choice.get("disable_parallel_tool_use", False)
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", parallel
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise APIError(400, 'tool_choice {"type": "tool"} needs the tool\'s "name"', param="tool_choice.name")
        return {"type": "function", "function": {"name": name}}, parallel
    raise APIError(400, f'tool_choice.type {kind!r} is not one of "auto", "any", "tool", "none"', param="tool_choice.type")
