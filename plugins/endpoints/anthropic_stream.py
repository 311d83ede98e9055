"""A streamed ``/v1/messages`` answer: Anthropic's server-sent events, each ``event: <type>``
then ``data: <json>``.

The order: ``message_start`` (the message without content, ``usage.input_tokens`` the prompt's
tokens), one ``ping``, then the content blocks one after another — ``content_block_start``,
its ``content_block_delta`` events (``thinking_delta`` in a ``thinking`` block, ``text_delta``
in a ``text`` block, ``input_json_delta`` fragments of a ``tool_use`` block's ``input``),
``content_block_stop`` — then ``message_delta`` (``stop_reason``, ``stop_sequence``,
``usage.output_tokens``) and ``message_stop``. The deltas come from the chat route's
:class:`ChoiceStream` (reasoning parser, then tool parser), so a block opens only for text that
is certain to be of its kind. An error after the stream began is an ``error`` event with
Anthropic's error body, and the stream ends there."""

from __future__ import annotations

import json
import logging
from typing import Any, AsyncIterator

from host.plugins.endpoints.anthropic_errors import anthropic_error_body
from host.plugins.endpoints.anthropic_output import message_shell, stop_reason, tool_use_id
from host.plugins.endpoints.chat_output import ChatParsing
from host.plugins.endpoints.openai_common import merged_stream

logger = logging.getLogger("host.api")


def event(kind: str, payload: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **payload}, ensure_ascii=False)}\n\n"


class ContentBlocks:
    """The open content block of a stream and the events that move it on: a delta of another
    kind (or a new tool call) closes the open block and starts the next one."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # "thinking", "text" or "tool_use"

    def _start(self, kind: str, block: dict[str, Any]) -> list[str]:
        out = self.close()
        self.index += 1
        self.open = kind
        return out + [event("content_block_start", {"index": self.index, "content_block": block})]

    def _delta(self, delta: dict[str, Any]) -> str:
        return event("content_block_delta", {"index": self.index, "delta": delta})

    def feed(self, delta: dict[str, Any]) -> list[str]:
        """The events of one chat delta (``reasoning_content``, ``content``, ``tool_calls``)."""
        out: list[str] = []
        thinking = delta.get("reasoning_content")
        if thinking:
            if self.open != "thinking":
                out += self._start("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append(self._delta({"type": "thinking_delta", "thinking": thinking}))
        text = delta.get("content")
        if text:
            if self.open != "text":
                out += self._start("text", {"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": text}))
        for call in delta.get("tool_calls") or ():
            fn = call.get("function") or {}
            if "id" in call:  # a call's first delta: its name, arguments to follow
                out += self._start("tool_use", {"type": "tool_use", "id": tool_use_id(), "name": fn.get("name"), "input": {}})
            if fn.get("arguments"):
                out.append(self._delta({"type": "input_json_delta", "partial_json": fn["arguments"]}))
        return out

    def close(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        return [event("content_block_stop", {"index": self.index})]


async def message_events(gen: AsyncIterator[Any], msg_id: str, model: str, input_tokens: int, parsing: ChatParsing,
                         stop_sequences: list[str] | None) -> AsyncIterator[str]:
    """The events of one generation (see the module's docstring)."""
    yield event("message_start", {"message": message_shell(msg_id, model, input_tokens)})
    yield event("ping", {})
    blocks, stream, final, done = ContentBlocks(), parsing.stream(), None, False
    try:
        async for _, res in merged_stream([gen]):
            final = res.outputs[0]
            done = final.finish_reason is not None
            for line in blocks.feed(stream.feed(final.text, done)):
                yield line
        if final is None:
            raise RuntimeError("the generation ended without an output")
        if not done:  # ended without a finish reason: what is held back goes out now
            for line in blocks.feed(stream.feed(final.text, True)):
                yield line
        for line in blocks.close():
            yield line
        reason, sequence = stop_reason(final, stream.called, stop_sequences)
        yield event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": sequence},
                                      "usage": {"output_tokens": len(final.token_ids)}})
        yield event("message_stop", {})
    except Exception as exc:  # noqa: BLE001 - the stream already started: an in-band error event
        logger.warning("messages stream %s failed: %s", msg_id, exc)
        status = 503 if type(exc).__name__ == "EngineDeadError" else 500
        body = anthropic_error_body(status, str(exc))
        yield f"event: error\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"
