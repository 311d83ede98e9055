"""A chat choice's generated text as the OpenAI message: reasoning split off first
(``--reasoning-parser``: ``reasoning_content``, and ``reasoning`` as newer vLLM names it), then
tool calls read from the rest by the parser the request's ``tool_choice`` selects
(:mod:`.tool_calls`). :class:`ChoiceStream` produces the same fields as streaming deltas."""

from __future__ import annotations

from typing import Any

from host.plugins.endpoints.tool_calls import NamedFunctionParser, RequiredCallsParser, ToolChoice
from host.sdk import ReasoningParser, ToolParser


class ChatParsing:
    """How one request's outputs are read: its :class:`ToolChoice`, the server's tool parser
    (used for ``"auto"``) and reasoning parser (either may be ``None``)."""

    def __init__(
        self, choice: ToolChoice, tool_parser: ToolParser | None, reasoning: ReasoningParser | None, include_reasoning: bool = True,
    ) -> None:
        self.choice = choice
        self.reasoning = reasoning
        self.include_reasoning = include_reasoning  # False: the reasoning is split off and dropped
        if choice.mode == "named":
            self.tool_parser: ToolParser | None = NamedFunctionParser(choice.function or "")
        elif choice.mode == "required":
            self.tool_parser = RequiredCallsParser()
        elif choice.mode == "auto":
            self.tool_parser = tool_parser
        else:
            self.tool_parser = None
        self.max_calls = None if choice.parallel else 1

    def message(self, text: str) -> tuple[dict[str, Any], bool]:
        """The ``message`` of a finished choice and whether it holds tool calls."""
        message: dict[str, Any] = {"role": "assistant"}
        content: str | None = text
        if self.reasoning is not None:
            reasoning, content = self.reasoning.split(text, final=True)
            if self.include_reasoning:
                message["reasoning_content"] = message["reasoning"] = reasoning
        calls = []
        if self.tool_parser is not None and content is not None:
            result = self.tool_parser.extract(content, self.choice.tools)
            calls = result.calls[: self.max_calls]
            content = result.content
            if calls and content is not None and not content.strip():
                content = None
        message["content"] = content
        if calls:
            message["tool_calls"] = [c.to_openai() for c in calls]
        return message, bool(calls)

    def stream(self) -> "ChoiceStream":
        return ChoiceStream(self)


class ChoiceStream:
    """The delta fields of one streamed choice; feed the whole text so far each time."""

    def __init__(self, parsing: ChatParsing) -> None:
        self.reasoning = parsing.reasoning.stream() if parsing.reasoning is not None else None
        self.include_reasoning = parsing.include_reasoning
        self.tools = parsing.tool_parser.stream(parsing.choice.tools, parsing.max_calls) if parsing.tool_parser is not None else None
        self.sent = 0  # content characters sent (without a tool parser)

    @property
    def called(self) -> bool:
        return self.tools is not None and self.tools.called

    def feed(self, text: str, final: bool) -> dict[str, Any]:
        """The next delta. Without parsers it always has ``content``, ``""`` when a step added
        no text (a token that completes no character, a finish on a stop string), as vLLM sends
        it: clients concatenate ``delta.content`` of every chunk, and ``null`` breaks them. With
        parsers a delta holds what changed, and ``content: ""`` when nothing did."""
        delta: dict[str, Any] = {}
        content = text
        if self.reasoning is not None:
            reasoning, content = self.reasoning.feed(text, final)
            if reasoning and self.include_reasoning:
                delta["reasoning_content"] = delta["reasoning"] = reasoning
        if self.tools is not None:
            delta.update(self.tools.finish(content) if final else self.tools.feed(content))
        else:
            new = content[self.sent:]
            if new or self.reasoning is None:
                delta["content"] = new
            self.sent = max(self.sent, len(content))
        return delta or {"content": ""}
