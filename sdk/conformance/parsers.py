"""The tool-call and reasoning parser suites: streamed output adds up to the finished parse."""

from __future__ import annotations

import json
from typing import ClassVar

from host.sdk.conformance.base import RegistrationCheck
from host.sdk.reasoning_parser import ReasoningParser
from host.sdk.tool_parser import ToolParser


class ToolParserConformance(RegistrationCheck):
    """Set ``parser`` (the :class:`ToolParser` subclass) and ``samples``: ``(model output text,
    [(function name, arguments as a dict), ...], content or None)`` in your format, including one
    without any call. ``tools``: the request's ``tools`` the samples are parsed with (for formats
    whose arguments are typed by the tools' JSON schemas); ``None`` for none."""

    parser: ClassVar[type[ToolParser] | None] = None
    samples: ClassVar[list[tuple[str, list[tuple[str, dict]], str | None]]] = []
    tools: ClassVar[list[dict] | None] = None
    registry_kind = "tool_parsers"
    group = "host.tool_parsers"

    def registered_name(self) -> str:
        return self.parser.name

    def test_extract_finds_the_calls_and_the_content(self) -> None:
        assert self.parser is not None and self.parser.name, "set `parser` to your ToolParser subclass (with a name)"
        assert self.samples, "give `samples` in your format, one without a call among them"
        for text, calls, content in self.samples:
            got = self.parser().extract(text, self.tools)
            assert [(c.name, json.loads(c.arguments)) for c in got.calls] == [(n, a) for n, a in calls], text
            assert (got.content or None) == (content or None), f"content {got.content!r} != {content!r} for {text!r}"

    def test_streamed_deltas_add_up_to_the_finished_parse(self) -> None:
        for text, calls, content in self.samples:
            stream = self.parser().stream(self.tools)
            deltas = [stream.feed(text[:i]) for i in range(1, len(text) + 1)] + [stream.finish(text)]
            streamed_content = "".join(d.get("content", "") for d in deltas)
            arguments: dict[int, str] = {}
            names: dict[int, str] = {}
            for d in deltas:
                for call in d.get("tool_calls", []):
                    fn = call.get("function", {})
                    if fn.get("name"):
                        names[call["index"]] = fn["name"]
                    arguments[call["index"]] = arguments.get(call["index"], "") + fn.get("arguments", "")
            assert [(names[i], json.loads(arguments[i])) for i in sorted(names)] == [(n, a) for n, a in calls], text
            if not calls:
                assert streamed_content == (content or ""), f"streamed content {streamed_content!r} != {content!r}"


class ReasoningParserConformance(RegistrationCheck):
    """Set ``parser`` (the :class:`ReasoningParser` subclass) and ``samples``: ``(output text,
    reasoning or None, content or None)``."""

    parser: ClassVar[type[ReasoningParser] | None] = None
    samples: ClassVar[list[tuple[str, str | None, str | None]]] = []
    registry_kind = "reasoning_parsers"
    group = "host.reasoning_parsers"

    def registered_name(self) -> str:
        return self.parser.name

    def test_split_separates_reasoning_from_content(self) -> None:
        assert self.parser is not None and self.parser.name, "set `parser` to your ReasoningParser subclass (with a name)"
        assert self.samples, "give `samples` in your format"
        for text, reasoning, content in self.samples:
            assert self.parser().split(text) == (reasoning, content), text

    def test_streamed_reasoning_adds_up_and_the_content_ends_whole(self) -> None:
        for text, reasoning, content in self.samples:
            stream = self.parser().stream()
            pieces = [stream.feed(text[:i])[0] for i in range(1, len(text))]
            last_delta, final_content = stream.feed(text, final=True)
            assert "".join(pieces) + last_delta == (reasoning or ""), text
            assert final_content == (content or ""), text
