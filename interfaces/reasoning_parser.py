"""Reasoning parser base class: splits a model's reasoning (``<think>...</think>``) from its answer.

A parser is a :class:`ReasoningParser` subclass registered under ``host.reasoning_parsers``
(hook ``host_register_reasoning_parsers``) and selected with ``--reasoning-parser NAME``. It
implements :meth:`ReasoningParser.split`, a pure function of the text generated so far:
``(reasoning, content)``. On an unfinished text (``final=False``) both parts must only grow as
the text grows, so a piece that could be the beginning of a tag is held back;
:class:`ReasoningStream` turns successive splits into ``reasoning_content`` / ``content`` deltas.

:meth:`ReasoningParser.end_token_ids` names the tokens that end the reasoning: with structured
outputs, the engine applies the grammar only once they have been generated
(``StructuredOutputsParams.reasoning_end_token_ids``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from host.interfaces.tool_parser import hold_back_prefix


class ReasoningParser:
    """One model family's reasoning format, delimited by ``start_tag`` and ``end_tag``.
    ``starts_in_reasoning``: the output begins inside the reasoning (the prompt opened it, as
    DeepSeek-R1's template does), so a missing start tag still means reasoning."""

    name: ClassVar[str] = ""
    start_tag: ClassVar[str] = "<think>"
    end_tag: ClassVar[str] = "</think>"
    starts_in_reasoning: ClassVar[bool] = False

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer

    def end_token_ids(self) -> list[int]:
        """The token ids of ``end_tag`` (one id for models where it is a special token)."""
        if self.tokenizer is None:
            raise ValueError(f"reasoning parser {self.name!r} has no tokenizer to encode {self.end_tag!r} with")
        return list(self.tokenizer.encode(self.end_tag, add_special_tokens=False))

    def split(self, text: str, final: bool = True) -> tuple[str | None, str | None]:
        """``(reasoning, content)`` of ``text``; ``None`` for a part that is absent."""
        body = text.lstrip()
        if body.startswith(self.start_tag):
            body = body[len(self.start_tag):]
        elif not self.starts_in_reasoning:
            if not final and self.start_tag.startswith(body):
                return None, None  # could still become the start tag
            return None, text
        else:
            if not final and body and self.start_tag.startswith(body):
                return None, None
            body = text
        end = body.find(self.end_tag)
        if end < 0:
            reasoning = body if final else hold_back_prefix(body, self.end_tag)
            return reasoning, None
        content = body[end + len(self.end_tag):]
        return body[:end], content if (content or not final) else None

    def stream(self) -> "ReasoningStream":
        return ReasoningStream(self)


class ReasoningStream:
    """The reasoning/content deltas of one streamed choice: feed the whole text so far."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.parser = parser
        self.reasoning = ""
        self.content = ""

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        """``(reasoning delta, content so far)``: the new reasoning text and the whole content
        (the content goes on to a tool parser, which wants it whole)."""
        reasoning, content = self.parser.split(text, final)
        reasoning = reasoning or ""
        delta = ""
        if len(reasoning) > len(self.reasoning) and reasoning.startswith(self.reasoning):
            delta = reasoning[len(self.reasoning):]
            self.reasoning = reasoning
        if content is not None:
            self.content = content
        return delta, self.content
