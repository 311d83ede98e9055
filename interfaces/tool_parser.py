"""Tool-call parser base class: turns a model's generated text into OpenAI ``tool_calls``.

A parser is a :class:`ToolParser` subclass registered under ``host.tool_parsers`` (hook
``host_register_tool_parsers``) and selected with ``--tool-call-parser NAME``. It implements two
pure functions of the text generated so far:

- :meth:`ToolParser.extract` on the finished text: ``ExtractedToolCalls(content, calls)``. Text
  that does not parse as the model's call format is returned as plain ``content`` with no calls
  (a malformed call is the model's fault, never a server error);
- :meth:`ToolParser.parse_partial` on an unfinished text: what is already certain, as a
  :class:`PartialToolCalls`. Its ``content`` must only grow as the text grows (hold back a
  possible beginning of a call marker), and a call listed once keeps its name.

:class:`ToolCallStream` turns successive ``parse_partial`` results (and a final ``extract``) into
the OpenAI streaming deltas: a call's first delta carries ``index``, ``id``, ``type`` and
``function.name`` with empty ``arguments``, later ones carry argument fragments.

For JSON-based formats, :func:`call_from_object` reads one ``{"name": ..., "arguments": ...}``
object and :func:`decode_sequence` the JSON values written one after another.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar


def tool_call_id() -> str:
    """A new call id, as vLLM spells them: ``chatcmpl-tool-<32 hex digits>``."""
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def arguments_json(arguments: Any) -> str:
    """``arguments`` as the JSON text OpenAI's ``function.arguments`` carries (a string that is
    already JSON is kept as it is)."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


@dataclass
class ToolCall:
    """One parsed call: the function's name and its arguments as JSON text."""

    name: str
    arguments: str
    id: str = field(default_factory=tool_call_id)

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ExtractedToolCalls:
    """A finished output: the text that is not a call (``None`` when there is none) and the calls."""

    content: str | None
    calls: list[ToolCall] = field(default_factory=list)


@dataclass
class PartialToolCalls:
    """An unfinished output: ``content`` that is certain to be content, and the calls begun so
    far as ``(name, arguments)``, where ``arguments`` is the complete JSON text once known, else
    ``None``."""

    content: str = ""
    calls: list[tuple[str, str | None]] = field(default_factory=list)


class ToolParser:
    """One model family's tool-call format. ``keep_special_tokens``: the format's markers are
    special tokens (Mistral's ``[TOOL_CALLS]``), so the route generates with
    ``skip_special_tokens=False`` when it parses calls."""

    name: ClassVar[str] = ""
    keep_special_tokens: ClassVar[bool] = False

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer

    def extract(self, text: str, tools: list[dict[str, Any]] | None = None) -> ExtractedToolCalls:
        """The content and calls of a finished output."""
        raise NotImplementedError

    def parse_partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> PartialToolCalls:
        """What is certain of an unfinished output; default: nothing until it is finished."""
        return PartialToolCalls()

    def stream(self, tools: list[dict[str, Any]] | None = None, max_calls: int | None = None) -> "ToolCallStream":
        """A streaming state for one choice (``max_calls=1`` keeps only the first call)."""
        return ToolCallStream(self, tools, max_calls)


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


def hold_back_prefix(text: str, marker: str) -> str:
    """``text`` without a trailing piece that could be the beginning of ``marker``."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return text[:-k]
    return text


class ToolCallStream:
    """The deltas of one streamed choice. Feed the whole text so far to :meth:`feed`, then once
    :meth:`finish`; each returns the delta fields to send (``content`` and/or ``tool_calls``),
    possibly empty."""

    def __init__(self, parser: ToolParser, tools: list[dict[str, Any]] | None, max_calls: int | None = None) -> None:
        self.parser = parser
        self.tools = tools
        self.max_calls = max_calls
        self.content = ""  # content sent so far
        self.calls: list[dict[str, Any]] = []  # per sent call: id, name, arguments sent

    @property
    def called(self) -> bool:
        """Whether a call was sent (the choice then finishes with ``"tool_calls"``)."""
        return bool(self.calls)

    def feed(self, text: str) -> dict[str, Any]:
        part = self.parser.parse_partial(text, self.tools)
        return self._delta(part.content, part.calls)

    def finish(self, text: str) -> dict[str, Any]:
        result = self.parser.extract(text, self.tools)
        return self._delta(result.content or "", [(c.name, c.arguments) for c in result.calls])

    def _delta(self, content: str, calls: list[tuple[str, str | None]]) -> dict[str, Any]:
        delta: dict[str, Any] = {}
        # content after a call only while the parse still has calls (harmony's final channel
        # follows its calls); an output that turned out malformed is not sent again as content
        if len(content) > len(self.content) and content.startswith(self.content) and (calls or not self.calls):
            delta["content"] = content[len(self.content):]
            self.content = content
        if self.max_calls is not None:
            calls = calls[: self.max_calls]
        out = []
        for i, (name, arguments) in enumerate(calls):
            if i >= len(self.calls):
                self.calls.append({"id": tool_call_id(), "name": name, "arguments": ""})
                out.append({"index": i, "id": self.calls[i]["id"], "type": "function", "function": {"name": name, "arguments": ""}})
            sent = self.calls[i]
            if arguments and len(arguments) > len(sent["arguments"]) and arguments.startswith(sent["arguments"]):
                # after the call's first entry, even in the same delta: that one's arguments stay ""
                out.append({"index": i, "function": {"arguments": arguments[len(sent["arguments"]):]}})
                sent["arguments"] = arguments
        if out:
            delta["tool_calls"] = out
        return delta
