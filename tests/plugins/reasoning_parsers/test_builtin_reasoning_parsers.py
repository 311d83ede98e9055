"""The built-in reasoning parsers on hand-written outputs, and their streams: the deltas of a
character-by-character stream add up to the non-streamed split."""

from __future__ import annotations

import pytest

from host.plugins.reasoning_parsers import DeepSeekR1ReasoningParser, Qwen3ReasoningParser, host_register_reasoning_parsers

CASES = [
    (DeepSeekR1ReasoningParser, "Paris is in France.\n</think>\n\nIt is Paris.", "Paris is in France.\n", "\n\nIt is Paris."),
    (DeepSeekR1ReasoningParser, "<think>Hmm, 2 < 3.</think>Yes.", "Hmm, 2 < 3.", "Yes."),
    (DeepSeekR1ReasoningParser, "still thinking, no end", "still thinking, no end", None),
    (DeepSeekR1ReasoningParser, "done</think>", "done", None),
    (Qwen3ReasoningParser, "<think>\nLet me see.\n</think>\n\nThe answer.", "\nLet me see.\n", "\n\nThe answer."),
    (Qwen3ReasoningParser, "The answer, without thinking.", None, "The answer, without thinking."),
    (Qwen3ReasoningParser, "<think>cut short", "cut short", None),
    (Qwen3ReasoningParser, "<thinking is not the tag", None, "<thinking is not the tag"),
]


@pytest.mark.parametrize("cls, text, reasoning, content", CASES)
def test_split(cls, text, reasoning, content):
    assert cls().split(text) == (reasoning, content)


@pytest.mark.parametrize("cls, text, reasoning, content", CASES)
def test_stream_adds_up_to_split(cls, text, reasoning, content):
    stream = cls().stream()
    sent_reasoning = ""
    for i in range(1, len(text) + 1):
        delta, whole = stream.feed(text[:i], final=i == len(text))
        sent_reasoning += delta
        assert "</think>" not in sent_reasoning and not sent_reasoning.startswith("<think>")
    assert sent_reasoning == (reasoning or "")
    assert whole == (content or "")


def test_end_token_ids_use_the_tokenizer():
    class Tok:
        def encode(self, text, add_special_tokens=False):
            assert text == "</think>" and add_special_tokens is False
            return [7]

    assert DeepSeekR1ReasoningParser(Tok()).end_token_ids() == [7]


def test_registered_names():
    seen = []
    host_register_reasoning_parsers(seen.append)
    assert [c.name for c in seen] == ["deepseek_r1", "qwen3"]
