"""``openai``: gpt-oss's harmony format. The output is a series of messages (the prompt ends with
``<|start|>assistant``, so the first one starts at its header)::

    <|channel|>analysis<|message|>Need the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>

A message with a recipient ``functions.NAME`` (written after the channel, or after the role) is a
call of ``NAME`` with its body as the JSON arguments (an empty body is ``{}``). The ``final``
channel, and ``commentary`` without a recipient (a preamble meant for the user), are content, in
order; the ``analysis`` channel is the reasoning, never content (``--reasoning-parser`` reads it).
Messages to built-in tools (``browser.*``, ``python``) are neither. A message ends at ``<|end|>``,
``<|call|>``, ``<|return|>``, the next ``<|start|>``, or the end of the text. An output with no
harmony header at all is plain content; a call whose body is not a JSON object makes the whole
output content. The markers are special tokens, so the route keeps them."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from host.sdk import ExtractedToolCalls, PartialToolCalls, ToolCall, ToolParser
from host.sdk.tool_parser import arguments_json

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
MARKERS = (START, CHANNEL, MESSAGE, CONSTRAIN, *ENDS)
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_END = re.compile("|".join(re.escape(m) for m in (*ENDS, START)))


@dataclass
class HarmonyMessage:
    """One message: its channel, recipient (``None`` for none), body, and whether it ended."""

    channel: str
    recipient: str | None
    body: str
    complete: bool


def harmony_messages(text: str) -> list[HarmonyMessage] | None:
    """The messages of ``text`` (the last one possibly unfinished: a header without its
    ``<|message|>`` yet is left out), or ``None`` when ``text`` is not harmony."""
    if CHANNEL not in text and not text.lstrip().startswith(START):
        return None
    messages: list[HarmonyMessage] = []
    pos = 0
    while pos < len(text):
        body_at = text.find(MESSAGE, pos)
        if body_at < 0:
            break  # a header still being written
        header = text[pos:body_at]
        if header.startswith(START):
            header = header[len(START):]
        words = header.split(CHANNEL, 1)[1].split(CONSTRAIN)[0].split() if CHANNEL in header else []
        channel = words[0] if words else ""
        recipient = _RECIPIENT.search(header)
        body_start = body_at + len(MESSAGE)
        end = _END.search(text, body_start)
        body = text[body_start: end.start() if end else len(text)]
        messages.append(HarmonyMessage(channel, recipient.group(1) if recipient else None, body, end is not None))
        if end is None:
            break
        pos = end.end() if end.group(0) != START else end.start()
    return messages


def _hold_back_marker(body: str) -> str:
    """``body`` without a trailing piece that could begin a marker."""
    cut = body.rfind("<")
    if cut >= 0 and any(m.startswith(body[cut:]) for m in MARKERS):
        return body[:cut]
    return body


def _call(message: HarmonyMessage) -> tuple[str, str] | None | bool:
    """A function call's ``(name, arguments)``, ``None`` when the message is not a function
    call, ``False`` when it is one whose body is not a JSON object."""
    if not message.recipient or not message.recipient.startswith("functions."):
        return None
    name = message.recipient[len("functions."):]
    body = message.body.strip()
    if not body:
        return name, "{}"
    try:
        arguments = json.loads(body)
    except json.JSONDecodeError:
        return False
    return (name, arguments_json(arguments)) if isinstance(arguments, dict) and name else False


def _is_content(message: HarmonyMessage) -> bool:
    return message.recipient is None and message.channel in ("final", "commentary", "")


class HarmonyToolParser(ToolParser):
    name = "openai"
    keep_special_tokens = True

    def extract(self, text: str, tools: list[dict[str, Any]] | None = None) -> ExtractedToolCalls:
        messages = harmony_messages(text)
        if messages is None:
            return ExtractedToolCalls(text, [])
        calls, content = [], []
        for message in messages:
            call = _call(message)
            if call is False:
                return ExtractedToolCalls(text, [])
            if call:
                calls.append(ToolCall(*call))
            elif _is_content(message):
                content.append(message.body)
        return ExtractedToolCalls("".join(content) or None, calls)

    def parse_partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> PartialToolCalls:
        messages = harmony_messages(text)
        if messages is None:
            stripped = text.lstrip()
            if any(m.startswith(stripped) for m in (START, CHANNEL)):
                return PartialToolCalls()  # could still become a header
            return PartialToolCalls(_hold_back_marker(text))
        calls: list[tuple[str, str | None]] = []
        content = ""
        for message in messages:
            call = _call(message) if message.complete else None
            if call is False:
                break  # all of the output will be content: announce nothing more
            if call:
                calls.append(call)
            elif _is_content(message):
                content += message.body if message.complete else _hold_back_marker(message.body)
        return PartialToolCalls(content, calls)

