"""The Messages stream's content blocks in-process, where a served model cannot reach: reasoning
(``--reasoning-parser qwen3``) as a ``thinking`` block, then text, then a ``tool_use`` block
read by the ``hermes`` parser, from an output that grows a few characters at a time. Each
block's deltas must add up to the text the output holds, and to the blocks of the same output
answered in one piece."""

from __future__ import annotations

import json

from host.plugins.endpoints.anthropic_output import content_blocks
from host.plugins.endpoints.anthropic_protocol import chat_tools
from host.plugins.endpoints.anthropic_stream import ContentBlocks
from host.plugins.endpoints.chat_output import ChatParsing
from host.plugins.endpoints.tool_calls import ToolChoice
from host.plugins.reasoning_parsers.think_tags import Qwen3ReasoningParser
from host.plugins.tool_parsers.hermes import HermesToolParser

TOOLS = chat_tools([{"name": "get_time", "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}}}])
OUTPUT = ('<think>The user wants the time.</think>Let me check.\n'
          '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>')


def events_of(lines: list[str]) -> list[dict]:
    out = []
    for line in lines:
        kind, data = line.strip().split("\n")
        payload = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {payload['type']}"
        out.append(payload)
    return out


def test_thinking_text_and_tool_use_blocks_in_order():
    parsing = ChatParsing(ToolChoice("auto", TOOLS), HermesToolParser(), Qwen3ReasoningParser())
    stream, blocks, lines = parsing.stream(), ContentBlocks(), []
    for end in range(3, len(OUTPUT), 3):  # as a generation grows
        lines += blocks.feed(stream.feed(OUTPUT[:end], False))
    lines += blocks.feed(stream.feed(OUTPUT, True)) + blocks.close()
    events = events_of(lines)

    starts = [e for e in events if e["type"] == "content_block_start"]
    assert [(e["index"], e["content_block"]["type"]) for e in starts] == [(0, "thinking"), (1, "text"), (2, "tool_use")]
    assert [e["index"] for e in events if e["type"] == "content_block_stop"] == [0, 1, 2]
    use = starts[2]["content_block"]
    assert use["name"] == "get_time" and use["id"].startswith("toolu_") and use["input"] == {}
    deltas = {i: "" for i in range(3)}
    for e in events:
        if e["type"] == "content_block_delta":
            d = e["delta"]
            deltas[e["index"]] += {"thinking_delta": d.get("thinking"), "text_delta": d.get("text"),
                                   "input_json_delta": d.get("partial_json")}[d["type"]]
    assert deltas[0] == "The user wants the time."
    assert deltas[1].strip() == "Let me check."
    assert json.loads(deltas[2]) == {"zone": "UTC"}
    assert stream.called  # the message's stop_reason is then "tool_use"

    # the same output in one piece: the same blocks
    message, called = parsing.message(OUTPUT)
    whole = content_blocks(message)
    assert called and [b["type"] for b in whole] == ["thinking", "text", "tool_use"]
    assert (whole[0]["thinking"], whole[1]["text"].strip(), whole[2]["input"]) == (deltas[0], deltas[1].strip(), {"zone": "UTC"})


def test_text_only_stream_is_one_text_block():
    parsing = ChatParsing(ToolChoice("none", None), None, None)
    stream, blocks = parsing.stream(), ContentBlocks()
    lines = blocks.feed(stream.feed("Hello", False)) + blocks.feed(stream.feed("Hello there", True)) + blocks.close()
    events = events_of(lines)
    assert [e["type"] for e in events] == ["content_block_start", "content_block_delta", "content_block_delta", "content_block_stop"]
    assert "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta") == "Hello there"
