"""The built-in tool parsers on hand-written model outputs (the formats as the model families'
own documentation shows them), malformed ones included, and their streaming deltas: for every
output, the deltas of a character-by-character stream add up to what ``extract`` returns."""

from __future__ import annotations

import json

import pytest

from host.core.plugins.manager import PluginHost
from host.core.plugins.settings import PluginSettings
from host.plugins.tool_parsers import (
    HermesToolParser,
    Llama3JsonToolParser,
    MistralToolParser,
    PythonicToolParser,
    host_register_tool_parsers,
)

PARIS = {"city": "Paris", "unit": "celsius"}


def calls_of(result) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in result.calls]


def streamed(parser, text: str, step: int = 1) -> tuple[str, list[tuple[str, dict]], list[dict]]:
    """Feed ``text`` growing by ``step`` characters, then finish; the content, the calls and the
    raw tool-call deltas, put together as a client would."""
    stream = parser.stream()
    deltas = [stream.feed(text[:i]) for i in range(step, len(text), step)] + [stream.finish(text)]
    content = "".join(d.get("content", "") for d in deltas)
    calls: dict[int, dict] = {}
    raw = [tc for d in deltas for tc in d.get("tool_calls", [])]
    for tc in raw:
        entry = calls.setdefault(tc["index"], {"name": tc["function"].get("name"), "arguments": ""})
        entry["arguments"] += tc["function"].get("arguments", "")
    return content, [(c["name"], json.loads(c["arguments"])) for c in calls.values()], raw


CASES = [
    # (parser, output, content, calls)
    (HermesToolParser, 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
     "Let me check.\n", [("get_weather", PARIS)]),
    (HermesToolParser, '<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>',
     None, [("a", {"x": 1}), ("b", {})]),
    (HermesToolParser, '<tool_call>{"name": "a", "arguments": "{\\"x\\": [1, 2]}"}</tool_call>', None, [("a", {"x": [1, 2]})]),
    (HermesToolParser, "No tools needed: 2 < 3.", "No tools needed: 2 < 3.", []),
    (HermesToolParser, '<tool_call>{"name": "a", "arguments": {"x": </tool_call>', '<tool_call>{"name": "a", "arguments": {"x": </tool_call>', []),
    (HermesToolParser, '<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>', []),
    (Llama3JsonToolParser, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
     None, [("get_weather", PARIS)]),
    (Llama3JsonToolParser, '{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}', None, [("a", {"x": 1}), ("b", {})]),
    (Llama3JsonToolParser, "Paris is sunny today.", "Paris is sunny today.", []),
    (Llama3JsonToolParser, '{"name": "a", "parameters": {"x": 1}} and then some', '{"name": "a", "parameters": {"x": 1}} and then some', []),
    (Llama3JsonToolParser, '{"city": "Paris"}', '{"city": "Paris"}', []),
    (MistralToolParser, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]', None, [("get_weather", PARIS)]),
    (MistralToolParser, 'Sure. [TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]</s>',
     "Sure. ", [("a", {"x": 1}), ("b", {})]),
    (MistralToolParser, '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}', None, [("get_weather", PARIS)]),
    (MistralToolParser, "[TOOL_CALLS][{'name': 'a'}]", "[TOOL_CALLS][{'name': 'a'}]", []),
    (MistralToolParser, "Just text.", "Just text.", []),
    (PythonicToolParser, "[get_weather(city='Paris', unit='celsius')]", None, [("get_weather", PARIS)]),
    (PythonicToolParser, '[a(x=1, y=[1, "two"], z={"k": None}), b()]', None, [("a", {"x": 1, "y": [1, "two"], "z": {"k": None}}), ("b", {})]),
    (PythonicToolParser, "<|python_start|>[a(flag=true)]<|python_end|>", None, [("a", {"flag": True})]),
    (PythonicToolParser, "[a(1)]", "[a(1)]", []),  # positional: not a call we can name
    (PythonicToolParser, "[__import__('os').system('rm -rf /')]", "[__import__('os').system('rm -rf /')]", []),
    (PythonicToolParser, "[a(x=open('f'))]", "[a(x=open('f'))]", []),  # never evaluated
    (PythonicToolParser, "[a(x=1", "[a(x=1", []),
    (PythonicToolParser, "The weather is nice.", "The weather is nice.", []),
]


@pytest.mark.parametrize("cls, text, content, calls", CASES)
def test_extract(cls, text, content, calls):
    result = cls().extract(text)
    assert result.content == content
    assert calls_of(result) == calls
    assert all(c.id.startswith("chatcmpl-tool-") and len(c.id) == len("chatcmpl-tool-") + 32 for c in result.calls)


@pytest.mark.parametrize("cls, text, content, calls", CASES)
def test_stream_adds_up_to_extract(cls, text, content, calls):
    for step in (1, 7):
        got_content, got_calls, raw = streamed(cls(), text, step)
        assert got_calls == calls
        assert got_content == (content or "")
        firsts = {}
        for tc in raw:
            firsts.setdefault(tc["index"], tc)
        for tc in firsts.values():  # a call's first delta: id, type, name and empty arguments
            assert tc["id"].startswith("chatcmpl-tool-") and tc["type"] == "function"
            assert tc["function"]["name"] and tc["function"]["arguments"] == ""


def test_stream_sends_a_call_once_its_block_is_complete():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>{"na'
    stream = HermesToolParser().stream()
    assert stream.feed(text[:40]) == {}  # unfinished: a malformed block must stay content
    header, fragment = stream.feed(text)["tool_calls"]
    assert header["function"] == {"name": "get_weather", "arguments": ""} and header["index"] == 0
    assert fragment == {"index": 0, "function": {"arguments": '{"city": "Paris"}'}}


def test_stream_holds_back_a_marker_prefix():
    stream = HermesToolParser().stream()
    assert stream.feed("Hi <tool_") == {"content": "Hi "}
    assert stream.feed("Hi <tool_x") == {"content": "<tool_x"}


def test_max_calls_keeps_the_first():
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {}}</tool_call>'
    stream = HermesToolParser().stream(max_calls=1)
    deltas = [stream.feed(text[:i]) for i in range(1, len(text))] + [stream.finish(text)]
    assert {tc["function"].get("name") for d in deltas for tc in d.get("tool_calls", [])} == {"a", None}


def test_registered_names():
    host = PluginHost(PluginSettings())
    seen = []
    host_register_tool_parsers(seen.append)
    names = ["hermes", "llama3_json", "mistral", "pythonic", "llama4_pythonic", "qwen3_coder", "openai", "deepseek_v3", "deepseek_v31", "granite"]
    assert [c.name for c in seen] == names
    host.bootstrap("api")
    assert set(host.registry("tool_parsers")) >= set(names)
