"""A response's output items and the streaming events that build them, from the generated text.

The text is read as on the chat route (:class:`host.plugins.endpoints.chat_output.ChoiceStream`:
reasoning split off by the reasoning parser, tool calls by the tool parser ``tool_choice``
selects); its deltas become output items in the order they appear:

- reasoning: a ``reasoning`` item (``rs_...``) with one ``reasoning_text`` content part:
  ``response.output_item.added``, ``response.content_part.added``,
  ``response.reasoning_text.delta``..., then ``response.reasoning_text.done``,
  ``response.content_part.done``, ``response.output_item.done``;
- content: a ``message`` item (``msg_...``) with one ``output_text`` part, the same sequence with
  ``response.output_text.delta`` / ``.done``. Whitespace alone does not open a message (a model
  often writes a newline before its tool call); it leads the first text that follows, or becomes
  the message of an output that has nothing else;
- each tool call: a ``function_call`` item (``fc_...``, ``call_id`` ``call_...``):
  ``response.output_item.added``, ``response.function_call_arguments.delta``..., then
  ``response.function_call_arguments.done`` and ``response.output_item.done``.

An item is done when the next one opens, or at :meth:`OutputBuilder.finish`; the last item takes
the response's status (``incomplete`` when the output was cut by ``max_output_tokens``), the
others are ``completed``. The non-streaming route runs the same builder over the finished text,
so both forms of a response hold the same items.

:class:`EventLog` numbers the events (``sequence_number`` from 0) and frames them as server-sent
events (``event: <type>`` and ``data: <json>``).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from host.plugins.endpoints.chat_output import ChatParsing


def new_id(prefix: str) -> str:
    """An item or response id: ``<prefix>_<32 hex digits>``."""
    return f"{prefix}_{uuid.uuid4().hex}"


class EventLog:
    """Events with their ``sequence_number``, collected until :meth:`drain` (as SSE frames)."""

    def __init__(self) -> None:
        self.number = 0
        self.pending: list[dict[str, Any]] = []

    def emit(self, type_: str, **fields: Any) -> dict[str, Any]:
        event = {"type": type_, "sequence_number": self.number, **fields}
        self.number += 1
        self.pending.append(event)
        return event

    def drain(self) -> str:
        """The pending events as server-sent events, and none pending afterwards."""
        out = "".join(f"event: {e['type']}\ndata: {json.dumps(e, ensure_ascii=False)}\n\n" for e in self.pending)
        self.pending = []
        return out


class OutputBuilder:
    """The output items of one response, built from successive texts (:meth:`feed` with the
    whole text so far), the events in ``log``."""

    def __init__(self, parsing: ChatParsing, log: EventLog) -> None:
        self.stream = parsing.stream()
        self.log = log
        self.items: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the item receiving deltas
        self.texts: dict[str, str] = {}  # reasoning / message item id -> its text so far
        self.calls: dict[int, dict[str, Any]] = {}  # the tool parser's call index -> its item
        self.held = ""  # whitespace content not sent yet

    @property
    def called(self) -> bool:
        return bool(self.calls)

    def feed(self, text: str, final: bool = False) -> None:
        delta = self.stream.feed(text, final)
        if delta.get("reasoning_content"):
            self._reasoning(delta["reasoning_content"])
        if delta.get("content"):
            self._content(delta["content"])
        for call in delta.get("tool_calls", ()):
            if "id" in call:
                self._open_call(call["index"], call["function"]["name"])
            arguments = call["function"].get("arguments")
            if arguments:
                self._arguments(call["index"], arguments)

    def finish(self, status: str) -> list[dict[str, Any]]:
        """Close the open item with ``status`` and return the items. Held whitespace becomes the
        message of an output without calls or a message; an empty output is one empty message."""
        if not self.calls and not any(item["type"] == "message" for item in self.items) and (self.held or not self.items):
            self._open_message()
            if self.held:
                self._text_delta(self.held)
        self.held = ""
        if self.open is not None:
            self._close(self.open, status)
        return self.items

    # -- items ---------------------------------------------------------------------------

    def _add(self, item: dict[str, Any]) -> dict[str, Any]:
        if self.open is not None:
            self._close(self.open, "completed")
        self.items.append(item)
        self.open = item
        self.log.emit("response.output_item.added", output_index=len(self.items) - 1, item=dict(item))
        return item

    def _index(self, item: dict[str, Any]) -> int:
        return next(i for i, it in enumerate(self.items) if it is item)

    def _reasoning(self, delta: str) -> None:
        item = self.open
        if item is None or item["type"] != "reasoning":
            item = self._add({"id": new_id("rs"), "type": "reasoning", "summary": [], "content": [], "status": "in_progress"})
            self.texts[item["id"]] = ""
            self._part_added(item, {"type": "reasoning_text", "text": ""})
        self.texts[item["id"]] += delta
        self.log.emit("response.reasoning_text.delta", item_id=item["id"], output_index=self._index(item), content_index=0, delta=delta)

    def _content(self, delta: str) -> None:
        if self.open is not None and self.open["type"] == "message":
            self._text_delta(delta)
            return
        self.held += delta
        if self.held.strip():
            self._open_message()
            self._text_delta(self.held)
            self.held = ""

    def _open_message(self) -> None:
        item = self._add({"id": new_id("msg"), "type": "message", "role": "assistant", "status": "in_progress", "content": []})
        self.texts[item["id"]] = ""
        self._part_added(item, {"type": "output_text", "text": "", "annotations": [], "logprobs": []})

    def _text_delta(self, delta: str) -> None:
        item = self.open
        assert item is not None and item["type"] == "message"
        self.texts[item["id"]] += delta
        self.log.emit("response.output_text.delta", item_id=item["id"], output_index=self._index(item), content_index=0,
                      delta=delta, logprobs=[])

    def _open_call(self, index: int, name: str) -> None:
        self.held = ""  # whitespace before a call is not a message
        self.calls[index] = self._add({
            "id": new_id("fc"), "type": "function_call", "call_id": new_id("call"), "name": name, "arguments": "",
            "status": "in_progress",
        })

    def _arguments(self, index: int, delta: str) -> None:
        item = self.calls[index]
        item["arguments"] += delta
        self.log.emit("response.function_call_arguments.delta", item_id=item["id"], output_index=self._index(item), delta=delta)

    def _part_added(self, item: dict[str, Any], part: dict[str, Any]) -> None:
        self.log.emit("response.content_part.added", item_id=item["id"], output_index=self._index(item), content_index=0, part=part)

    def _close(self, item: dict[str, Any], status: str) -> None:
        index = self._index(item)
        ids = {"item_id": item["id"], "output_index": index}
        if item["type"] == "function_call":
            self.log.emit("response.function_call_arguments.done", **ids, name=item["name"], arguments=item["arguments"])
        else:
            text = self.texts[item["id"]]
            if item["type"] == "reasoning":
                part: dict[str, Any] = {"type": "reasoning_text", "text": text}
                self.log.emit("response.reasoning_text.done", **ids, content_index=0, text=text)
            else:
                part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
                self.log.emit("response.output_text.done", **ids, content_index=0, text=text, logprobs=[])
            self.log.emit("response.content_part.done", **ids, content_index=0, part=part)
            item["content"] = [part]
        item["status"] = status
        self.log.emit("response.output_item.done", output_index=index, item=dict(item))
        self.open = None
