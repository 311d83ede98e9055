"""A generated output as Anthropic's ``Message``: content blocks, ``stop_reason`` and ``usage``.

The text is read by the chat route's :class:`ChatParsing` (reasoning parser, then the tool parser
the request's ``tool_choice`` selects); its parts become blocks in this order: a ``thinking``
block (with ``--reasoning-parser``; ``signature`` is ``""``, host signs nothing), a ``text``
block (when there is text), one ``tool_use`` block per call (``id`` ``toolu_...``, ``input`` the
arguments object). ``stop_reason``: ``"tool_use"`` for an output that stopped on its own with
calls, ``"max_tokens"`` at the token limit, ``"stop_sequence"`` (with ``stop_sequence``) on one of
the request's ``stop_sequences``, else ``"end_turn"``. ``usage``: ``input_tokens`` the prompt's
tokens, ``output_tokens`` the generated ones."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from host.plugins.endpoints.chat_output import ChatParsing

logger = logging.getLogger("host.api")


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex}"


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments (JSON text from a tool parser) as the ``input`` object; ``{}`` (with a
    warning) for text that is not a JSON object, which a parser should never hand over."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        logger.warning("tool call arguments %r are not a JSON object; sent as {}", arguments[:80])
        return {}
    return value


def stop_reason(comp: Any, called: bool, stop_sequences: list[str] | None) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)`` of a finished output (see the module's docstring)."""
    if called and comp.finish_reason == "stop":
        return "tool_use", None
    if comp.finish_reason == "length":
        return "max_tokens", None
    if isinstance(comp.stop_reason, str) and comp.stop_reason in (stop_sequences or ()):
        return "stop_sequence", comp.stop_reason
    return "end_turn", None


def usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens}


def message_shell(msg_id: str, model: str, input_tokens: int) -> dict[str, Any]:
    """The ``Message`` before any content: what a stream's ``message_start`` carries."""
    return {
        "id": msg_id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": usage(input_tokens, 0),
    }


def content_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The blocks of a chat ``message`` as :meth:`ChatParsing.message` builds it."""
    blocks: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or ():
        fn = call["function"]
        blocks.append({"type": "tool_use", "id": tool_use_id(), "name": fn["name"], "input": tool_input(fn["arguments"])})
    return blocks


def finished_message(result: Any, msg_id: str, model: str, parsing: ChatParsing, stop_sequences: list[str] | None) -> dict[str, Any]:
    """The non-streamed answer of a finished ``RequestOutput`` (one output)."""
    comp = result.outputs[0]
    message, called = parsing.message(comp.text)
    reason, sequence = stop_reason(comp, called, stop_sequences)
    return {
        **message_shell(msg_id, model, len(result.prompt_token_ids)),
        "content": content_blocks(message),
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(len(result.prompt_token_ids), len(comp.token_ids)),
    }
