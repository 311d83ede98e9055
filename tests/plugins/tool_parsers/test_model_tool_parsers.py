"""The tool parsers of popular open models (``qwen3_coder``, ``openai``, ``llama4_pythonic``,
``deepseek_v3``, ``granite``) on recorded model outputs (``fixtures/<parser>.json``: the text,
the request's tools, the expected calls and content, and where each output comes from), through
the SDK's conformance suite, then on edge cases: several calls, arguments with nested JSON,
newlines and unicode, content before the call, malformed output left as content. Every output is
also streamed split at every character boundary: the deltas add up to the finished parse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import host.plugins.tool_parsers as tool_plugin
from host.plugins.tool_parsers import (
    DeepSeekV3ToolParser,
    DeepSeekV31ToolParser,
    GraniteToolParser,
    HarmonyToolParser,
    Llama4PythonicToolParser,
    PythonicToolParser,
    Qwen3CoderToolParser,
)
from host.sdk.testing import ToolParserConformance

FIXTURES = Path(__file__).parent / "fixtures"
PARSERS = {
    "qwen3_coder": Qwen3CoderToolParser,
    "openai": HarmonyToolParser,
    "llama4_pythonic": Llama4PythonicToolParser,
    "deepseek_v3": DeepSeekV3ToolParser,
    "granite": GraniteToolParser,
}


def load(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))


def fixture_cases() -> list:
    cases = []
    for name, cls in PARSERS.items():
        fixture = load(name)
        assert fixture["parser"] == name == cls.name
        for i, sample in enumerate(fixture["samples"]):
            assert sample["source"], f"{name} sample {i} names no source"
            calls = [(n, a) for n, a in sample["calls"]]
            cases.append(pytest.param(cls, fixture["tools"], sample["text"], calls, sample["content"], id=f"{name}-{i}"))
    return cases


def _conformance(name: str, cls: type) -> type:
    fixture = load(name)
    return type(
        f"TestConformance_{name}",
        (ToolParserConformance,),
        {
            "parser": cls,
            "plugin_module": tool_plugin,
            "tools": fixture["tools"],
            "samples": [(s["text"], [(n, a) for n, a in s["calls"]], s["content"]) for s in fixture["samples"]],
        },
    )


for _name, _cls in PARSERS.items():
    globals()[f"TestConformance_{_name}"] = _conformance(_name, _cls)


def streamed(parser, text: str, tools=None) -> tuple[str, list[tuple[str, dict]]]:
    """Feed every prefix of ``text``, then finish: the content and calls a client assembles, each
    call's first delta checked for its shape."""
    stream = parser.stream(tools)
    deltas = [stream.feed(text[:i]) for i in range(1, len(text))] + [stream.finish(text)]
    content = "".join(d.get("content", "") for d in deltas)
    calls: dict[int, dict] = {}
    for d in deltas:
        for tc in d.get("tool_calls", []):
            if tc["index"] not in calls:
                assert tc["id"].startswith("chatcmpl-tool-") and tc["type"] == "function"
                assert tc["function"]["name"] and tc["function"]["arguments"] == ""
                calls[tc["index"]] = {"name": tc["function"]["name"], "arguments": ""}
            calls[tc["index"]]["arguments"] += tc["function"].get("arguments", "")
    return content, [(c["name"], json.loads(c["arguments"])) for c in calls.values()]


def check(cls, tools, text, calls, content) -> None:
    result = cls().extract(text, tools)
    assert [(c.name, json.loads(c.arguments)) for c in result.calls] == calls, text
    assert result.content == content, text
    got_content, got_calls = streamed(cls(), text, tools)
    assert got_calls == calls, f"streamed calls of {text!r}"
    assert got_content == (content or ""), f"streamed content of {text!r}"


@pytest.mark.parametrize("cls, tools, text, calls, content", fixture_cases())
def test_recorded_outputs(cls, tools, text, calls, content):
    check(cls, tools, text, calls, content)


# -- edge cases -----------------------------------------------------------------------------

NESTED = {"filter": {"tags": ["a", "b"], "range": {"from": 1, "to": 2.5}}, "note": "line1\nline2 — ünïcødé 🌧"}
NESTED_JSON = json.dumps(NESTED, ensure_ascii=False)
QWEN_TOOLS = [
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
        "filter": {"type": "object"}, "note": {"type": "string"}, "limit": {"type": ["integer", "null"]},
        "exact": {"type": "boolean"}, "score": {"type": "number"}, "ids": {"anyOf": [{"type": "array"}, {"type": "null"}]},
        "zip": {"type": "string"}}}}},
]


def qwen_call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


EDGE = [
    # qwen3_coder
    (Qwen3CoderToolParser, QWEN_TOOLS, "Searching.\n" + qwen_call("search", filter=json.dumps(NESTED["filter"]), note=NESTED["note"]),
     [("search", NESTED)], "Searching.\n"),
    (Qwen3CoderToolParser, QWEN_TOOLS, qwen_call("search", limit="null", exact="False", score="2", ids="[1, 2]", zip="02134"),
     [("search", {"limit": None, "exact": False, "score": 2, "ids": [1, 2], "zip": "02134"})], None),
    (Qwen3CoderToolParser, QWEN_TOOLS, qwen_call("search", limit="ten", score="1e999", filter="{'k': b'x'}", ids="[NaN]"),
     [("search", {"limit": "ten", "score": "1e999", "filter": "{'k': b'x'}", "ids": "[NaN]"})], None),  # not JSON of their type: strings
    (Qwen3CoderToolParser, None, qwen_call("search", limit="3", note="x"), [("search", {"limit": "3", "note": "x"})], None),  # no schema: strings
    (Qwen3CoderToolParser, QWEN_TOOLS, qwen_call("search", note="<p>a</parameter> in code</p>"),
     [("search", {"note": "<p>a</parameter> in code</p>"})], None),  # the tag inside a value
    (Qwen3CoderToolParser, QWEN_TOOLS, qwen_call("a") + qwen_call("b", note="y"), [("a", {}), ("b", {"note": "y"})], None),
    (Qwen3CoderToolParser, QWEN_TOOLS, "<function=search>\n<parameter=note>\nbare\n</parameter>\n</function>", [("search", {"note": "bare"})], None),
    (Qwen3CoderToolParser, QWEN_TOOLS, "x < y <tool_call>\n<function=search>\n<parameter=note>\ncut off",
     [], "x < y <tool_call>\n<function=search>\n<parameter=note>\ncut off"),
    (Qwen3CoderToolParser, QWEN_TOOLS, "<tool_call>\n{\"name\": \"search\"}\n</tool_call>", [], "<tool_call>\n{\"name\": \"search\"}\n</tool_call>"),
    # openai (harmony)
    (HarmonyToolParser, None,
     "<|channel|>analysis<|message|>Two lookups.<|end|><|start|>assistant<|channel|>commentary to=functions.search <|constrain|>json<|message|>"
     + NESTED_JSON + "<|call|><|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{\"tz\": \"UTC\"}<|call|>",
     [("search", NESTED), ("get_time", {"tz": "UTC"})], None),
    (HarmonyToolParser, None,
     "<|channel|>analysis<|message|>Say hi first.<|end|><|start|>assistant<|channel|>commentary<|message|>Checking… ✓<|end|>"
     "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>",
     [("f", {})], "Checking… ✓"),
    (HarmonyToolParser, None, "<|channel|>analysis<|message|>Use the browser.<|end|><|start|>assistant<|channel|>analysis to=browser.search<|message|>{\"query\": \"x\"}<|call|>",
     [], None),  # a built-in tool's call is not a function call
    (HarmonyToolParser, None, "<|channel|>final<|message|>a <| b, 2<3", [], "a <| b, 2<3"),  # unfinished, no end marker
    (HarmonyToolParser, None, "Plain text, no harmony.", [], "Plain text, no harmony."),
    (HarmonyToolParser, None, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{not json<|call|>",
     [], "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{not json<|call|>"),
    # llama4_pythonic
    (Llama4PythonicToolParser, None, "Let me check. <|python_start|>[search(filter={'tags': ['a', 'b'], 'range': {'from': 1, 'to': 2.5}}, "
     "note='line1\\nline2 — ünïcødé 🌧'), get_time()]<|python_end|>",
     [("search", NESTED), ("get_time", {})], "Let me check. "),
    (Llama4PythonicToolParser, None, "Sure <|python_start|>[f(1)]<|python_end|>", [], "Sure <|python_start|>[f(1)]<|python_end|>"),
    (Llama4PythonicToolParser, None, "<|python_start|>[calc(x=1e999)]<|python_end|>", [], "<|python_start|>[calc(x=1e999)]<|python_end|>"),
    (Llama4PythonicToolParser, None, "The list [1, 2] is short.", [], "The list [1, 2] is short."),
    # deepseek_v3
    (DeepSeekV3ToolParser, None,
     "想一想。<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n" + json.dumps(NESTED, indent=2, ensure_ascii=False)
     + "\n```<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"tz\": \"UTC\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
     [("search", NESTED), ("get_time", {"tz": "UTC"})], "想一想。"),
    (DeepSeekV3ToolParser, None, "<｜tool▁calls▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Tokyo\"}\n```<｜tool▁calls▁end｜>",
     [], "<｜tool▁calls▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Tokyo\"}\n```<｜tool▁calls▁end｜>"),
    (DeepSeekV3ToolParser, None, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Tokyo\"\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     [], "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Tokyo\"\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    (DeepSeekV31ToolParser, None, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>foo<｜tool▁sep｜>{\"x\": [1, {\"y\": null}]}<｜tool▁call▁end｜>",
     [("foo", {"x": [1, {"y": None}]})], None),  # closing marker cut by the stop
    # granite
    (GraniteToolParser, None, "Checking.\n<tool_call>[{\"name\": \"search\", \"arguments\": " + NESTED_JSON + "}, {\"name\": \"get_time\", \"arguments\": {}}]<|end_of_text|>",
     [("search", NESTED), ("get_time", {})], "Checking.\n"),
    (GraniteToolParser, None, "<|tool_call|>[{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}]", [("f", {"a": 1})], None),  # arguments as JSON text
    (GraniteToolParser, None, "<|tool_call|>[{\"name\": \"f\"}, {\"arguments\": {}}]", [], "<|tool_call|>[{\"name\": \"f\"}, {\"arguments\": {}}]"),
    (GraniteToolParser, None, "Use <tool_call> tags like <this>.", [], "Use <tool_call> tags like <this>."),
]


@pytest.mark.parametrize("cls, tools, text, calls, content", EDGE, ids=[f"{c[0].name}-{i}" for i, c in enumerate(EDGE)])
def test_edge_cases(cls, tools, text, calls, content):
    check(cls, tools, text, calls, content)


def test_qwen3_coder_announces_a_call_once_its_block_is_closed():
    text = qwen_call("search", note="x") + "\n" + qwen_call("search", note="y")
    stream = Qwen3CoderToolParser().stream(QWEN_TOOLS)
    first_end = text.index("</tool_call>") + len("</tool_call>")
    assert "tool_calls" not in stream.feed(text[: first_end - 1])
    header, fragment = stream.feed(text[:first_end])["tool_calls"]
    assert header["function"] == {"name": "search", "arguments": ""}
    assert json.loads(fragment["function"]["arguments"]) == {"note": "x"}


def test_harmony_streams_the_final_channel_as_it_is_written():
    text = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hello there<|return|>"
    stream = HarmonyToolParser().stream()
    pieces = [stream.feed(text[:i]).get("content", "") for i in range(1, len(text) + 1)]
    assert "".join(pieces) == "Hello there"
    assert not any("Think" in p or "<|" in p for p in pieces)  # the analysis is never content
    assert pieces.index("H") < len(text) - len("ello there<|return|>")  # before the message ends


def test_llama4_pythonic_shares_pythonics_reader():
    assert issubclass(Llama4PythonicToolParser, PythonicToolParser) and Llama4PythonicToolParser.keep_special_tokens
    assert PythonicToolParser().extract("[calc(x=1e999)]").calls == []  # non-finite numbers are not JSON


def test_registered():
    seen = []
    tool_plugin.host_register_tool_parsers(seen.append)
    assert {"qwen3_coder", "openai", "llama4_pythonic", "deepseek_v3", "deepseek_v31", "granite"} <= {c.name for c in seen}
    assert all(cls.keep_special_tokens for cls in (HarmonyToolParser, DeepSeekV3ToolParser, GraniteToolParser, Llama4PythonicToolParser))
