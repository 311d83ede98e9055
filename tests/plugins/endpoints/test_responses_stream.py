"""The Responses output builder (plugins/endpoints/responses_stream.py) without a server: texts
as a model writes them, read by the real ``deepseek_r1`` reasoning parser and ``hermes`` tool
parser. Every event is validated against the official ``openai`` client's event types and fed
to the client's own stream accumulator (``ResponseStreamState``, what
``client.responses.stream`` runs), which refuses an out-of-order or inconsistent sequence."""

from __future__ import annotations

import json

import pytest
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from host.core.frontend.output_processor import CompletionOutput, RequestOutput
from host.plugins.endpoints.chat_output import ChatParsing
from host.plugins.endpoints.responses import ResponseJob, reasoning_tokens
from host.plugins.endpoints.responses_protocol import ResponsesRequest
from host.plugins.endpoints.responses_store import ResponseStore
from host.plugins.endpoints.responses_stream import EventLog, OutputBuilder
from host.plugins.endpoints.tool_calls import ToolChoice
from host.plugins.reasoning_parsers.think_tags import DeepSeekR1ReasoningParser
from host.plugins.tool_parsers.hermes import HermesToolParser
from host.sdk.sampling_params import SamplingParams

TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}]
EVENTS = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from host.core.models.default_model import default_model_path

    return AutoTokenizer.from_pretrained(default_model_path())


def parsing(tools: bool = True, reasoning: bool = True, tokenizer=None) -> ChatParsing:
    return ChatParsing(
        ToolChoice("auto" if tools else "none", TOOLS if tools else None),
        HermesToolParser(tokenizer) if tools else None,
        DeepSeekR1ReasoningParser(tokenizer) if reasoning else None,
    )


def job(p: ChatParsing) -> ResponseJob:
    body = ResponsesRequest.model_validate({"input": "hi"})
    return ResponseJob(body, "resp_test", "m", p, SamplingParams(temperature=0.0), [], ResponseStore(4, 60), 16)


def run(text: str, step: int | None, status: str = "completed", **kw) -> tuple[list[dict], list[dict]]:
    """The events and items of ``text`` fed ``step`` characters at a time (``None``: at once),
    each event checked by the client's types and accumulator."""
    p = parsing(**kw)
    j, log = job(p), EventLog()
    builder = OutputBuilder(p, log)
    log.emit("response.created", response=j.object("in_progress", []))
    cuts = range(step, len(text), step) if step else []
    for cut in cuts:
        builder.feed(text[:cut])
    builder.feed(text, final=True)
    items = builder.finish(status)
    log.emit("response.completed", response=j.object(status, items))
    events = json.loads(json.dumps(log.pending))  # what a client receives
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    state = ResponseStreamState(input_tools=omit, text_format=omit)
    for e in events:
        state.handle_event(EVENTS.validate_python(e))
    return events, json.loads(json.dumps(items))


def types(events: list[dict]) -> list[str]:
    return [e["type"] for e in events]


def strip_ids(items: list[dict]) -> list[dict]:
    return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in items]


@pytest.mark.parametrize("step", [None, 1, 3])
def test_reasoning_then_text(step):
    events, items = run("Let me think</think>The answer is 4.", step, tools=False)
    assert [(i["type"], i["status"]) for i in items] == [("reasoning", "completed"), ("message", "completed")]
    assert items[0]["content"] == [{"type": "reasoning_text", "text": "Let me think"}]
    assert items[1]["content"][0]["text"] == "The answer is 4." and items[1]["role"] == "assistant"
    assert "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta") == "Let me think"
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "The answer is 4."
    if step is None:
        assert types(events) == [
            "response.created",
            "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
            "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
            "response.output_item.added", "response.content_part.added", "response.output_text.delta",
            "response.output_text.done", "response.content_part.done", "response.output_item.done",
            "response.completed",
        ]


def test_streamed_and_whole_give_the_same_items():
    text = "<think>plan</think>Sure.\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}\n</tool_call>"
    whole = strip_ids(run(text, None)[1])
    assert whole == strip_ids(run(text, 1)[1]) == strip_ids(run(text, 7)[1])
    assert [i["type"] for i in whole] == ["reasoning", "message", "function_call"]
    assert whole[2]["name"] == "get_time" and json.loads(whole[2]["arguments"]) == {"zone": "UTC"}


def test_whitespace_before_a_call_opens_no_message():
    events, items = run("</think>\n\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>", 2)
    assert [i["type"] for i in items] == ["function_call"]
    assert items[0]["call_id"].startswith("call_") and items[0]["id"].startswith("fc_")
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [(e["name"], json.loads(e["arguments"])) for e in done] == [("get_time", {})]
    assert "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta") == items[0]["arguments"]


def test_empty_and_cut_outputs():
    _, items = run("", None, tools=False, reasoning=False)
    assert [(i["type"], i["content"][0]["text"]) for i in items] == [("message", "")]
    _, items = run("  ", 1, tools=False, reasoning=False)  # whitespace alone is the message
    assert items[0]["content"][0]["text"] == "  "
    _, items = run("still thinking", 4, status="incomplete", tools=False)  # cut inside the reasoning
    assert [(i["type"], i["status"]) for i in items] == [("reasoning", "incomplete")]
    _, items = run("</think>Hello there", 4, status="incomplete")
    assert [(i["type"], i["status"]) for i in items] == [("message", "incomplete")]


def test_usage_counts_reasoning_tokens(tokenizer):
    parts = [tokenizer.encode(t, add_special_tokens=False) for t in ("Let me think", "</think>", "Hello")]
    ids = [i for part in parts for i in part]
    p = parsing(tools=False, tokenizer=tokenizer)
    j = job(p)
    result = RequestOutput("r", None, list(range(40)), [CompletionOutput(0, tokenizer.decode(ids), ids, "stop")], True, 32)
    response = j.complete(result)
    assert [i["type"] for i in response["output"]] == ["reasoning", "message"]
    assert response["status"] == "completed" and response["incomplete_details"] is None
    assert response["usage"] == {
        "input_tokens": 40, "input_tokens_details": {"cached_tokens": 32, "cache_write_tokens": 0},
        "output_tokens": len(ids), "output_tokens_details": {"reasoning_tokens": len(parts[0]) + len(parts[1])},
        "total_tokens": 40 + len(ids),
    }
    assert reasoning_tokens(ids, parts[1], False) == 0
    assert reasoning_tokens(parts[0], parts[1], True) == len(parts[0])  # never ended: all of it
    cut = RequestOutput("r", None, list(range(50)), [CompletionOutput(0, "</think>Hi", [1, 2], "length")], True, 0)
    response = j.complete(cut)
    assert response["status"] == "incomplete" and response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["usage"]["input_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": 48}
