"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``) through the
official ``anthropic`` client, against one real ``host serve --api-key KEY --enable-auto-tool-choice
--tool-call-parser hermes`` on SmolLM2-135M-Instruct.

The model knows nothing of tools: ``tool_choice`` any and a named tool must still return
``tool_use`` blocks whose ``input`` validates (``jsonschema``) against the tool's own
``input_schema``. Streamed answers are compared with the non-streamed ones of the same greedy
request; ``count_tokens`` with the ``usage.input_tokens`` the route really used."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import pytest

from helpers import Server, run_server

KEY = "anthropic-sekret"
MODEL = "m"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET", "PST"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {"name": "get_weather", "description": "Current weather in a city", "input_schema": WEATHER},
    {"name": "get_time", "description": "Current time in a zone", "input_schema": TIME},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0}  # the client (2.17) no longer has the sampling arguments; the API still takes them
SYSTEM = [{"type": "text", "text": "You are a helpful assistant."}, {"type": "text", "text": "Answer briefly."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Server:
    args = ["--api-key", KEY, "--served-model-name", MODEL, "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    with run_server(tmp_path_factory.mktemp("messages"), args) as s:
        yield s


@pytest.fixture(scope="module")
def claude(server) -> anthropic.Anthropic:
    """The client as Claude Code's kind configure it: the key sent as ``x-api-key``."""
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=120)


def tool_uses(message) -> list:
    uses = [b for b in message.content if b.type == "tool_use"]
    for use in uses:
        assert use.id.startswith("toolu_")
        jsonschema.validate(use.input, SCHEMAS[use.name])
    return uses


def text_of(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def test_create_streamed_and_not_with_usage(claude, server):
    kwargs = dict(model=MODEL, system=SYSTEM, messages=ASK, max_tokens=6, extra_body=GREEDY)
    msg = claude.messages.create(**kwargs)
    assert msg.type == "message" and msg.role == "assistant" and msg.model == MODEL and msg.id.startswith("msg_")
    assert [b.type for b in msg.content] == ["text"] and text_of(msg)
    # six tokens is too few for SmolLM2 to finish its answer
    assert (msg.stop_reason, msg.stop_sequence, msg.usage.output_tokens) == ("max_tokens", None, 6)
    counted = claude.messages.count_tokens(model=MODEL, system=SYSTEM, messages=ASK)
    assert counted.input_tokens == msg.usage.input_tokens
    # the system blocks are in the prompt, joined by a newline
    as_string = claude.messages.count_tokens(model=MODEL, system="\n".join(b["text"] for b in SYSTEM), messages=ASK)
    assert as_string.input_tokens == counted.input_tokens
    assert claude.messages.count_tokens(model=MODEL, system=SYSTEM[:1], messages=ASK).input_tokens < counted.input_tokens

    with claude.messages.stream(**kwargs) as stream:
        streamed_text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed_text == text_of(final) == text_of(msg)  # greedy: the same answer
    assert (final.stop_reason, final.usage.input_tokens, final.usage.output_tokens) == ("max_tokens", msg.usage.input_tokens, 6)

    # the raw event sequence, ping included (the client skips it)
    raw = {**{k: v for k, v in kwargs.items() if k != "extra_body"}, **GREEDY, "max_tokens": 2, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/messages", json=raw, headers={"x-api-key": KEY}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        names = [line.removeprefix("event: ") for line in r.iter_lines() if line.startswith("event: ")]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_stop_sequences(claude):
    kwargs = dict(model=MODEL, messages=ASK, max_tokens=8, extra_body=GREEDY)
    free = text_of(claude.messages.create(**kwargs))
    words = free.split()
    assert len(words) >= 3, free
    stop = " " + words[1]
    msg = claude.messages.create(**kwargs, stop_sequences=["never-generated", stop])
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", stop)
    assert text_of(msg) == free[: free.index(stop)]
    with claude.messages.stream(**kwargs, stop_sequences=[stop]) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence, text_of(final)) == ("stop_sequence", stop, text_of(msg))


def test_prefill_continues_the_assistant_turn(claude, server):
    prefill = [*ASK, {"role": "assistant", "content": "The weather in Paris is"}]
    msg = claude.messages.create(model=MODEL, messages=prefill, max_tokens=3, extra_body=GREEDY)
    assert msg.stop_reason == "max_tokens" and text_of(msg)
    counted = claude.messages.count_tokens(model=MODEL, messages=prefill).input_tokens
    assert counted == msg.usage.input_tokens
    # the turn is continued: the prompt ends with the prefill (the same text as a chat continue_final_message)
    chat = httpx.post(f"{server.url}/tokenize", headers={"x-api-key": KEY}, json={
        "messages": prefill, "continue_final_message": True, "add_generation_prompt": False}).json()
    assert chat["count"] == counted


def test_claude_code_loop(claude):
    """tool_choice any -> tool_use -> tool_result -> a final text answer, streamed as Claude Code runs it."""
    messages = list(ASK)
    kwargs = dict(model=MODEL, system=SYSTEM, tools=TOOLS, max_tokens=40, extra_body=GREEDY)
    with claude.messages.stream(**kwargs, messages=messages, tool_choice={"type": "any", "disable_parallel_tool_use": True}) as stream:
        events = list(stream)
        first = stream.get_final_message()
    assert first.stop_reason == "tool_use"
    [use] = tool_uses(first)
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["tool_use"]
    partial = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
    assert json.loads(partial) == use.input
    # the tools are in the prompt: count_tokens renders them as the route did
    assert claude.messages.count_tokens(model=MODEL, system=SYSTEM, tools=TOOLS, messages=messages).input_tokens == first.usage.input_tokens

    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]})
    messages.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "18 degrees and sunny."}]},
    ]})
    # SmolLM2 imitates the call in its history (with auto, the hermes parser reads it as another one): the
    # final turn allows no tools, so the answer is text whatever the model writes
    final = claude.messages.create(**{**kwargs, "max_tokens": 6}, messages=messages, tool_choice={"type": "none"})
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in final.content] == ["text"] and text_of(final).strip()
    counted = claude.messages.count_tokens(model=MODEL, system=SYSTEM, tools=TOOLS, messages=messages).input_tokens
    assert counted == final.usage.input_tokens > first.usage.input_tokens + 10  # the call and its result are in the prompt
    failed = [*messages[:-1], {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": use.id, "content": "the weather service is down", "is_error": True},
    ]}]
    errored = claude.messages.count_tokens(model=MODEL, system=SYSTEM, tools=TOOLS, messages=failed).input_tokens
    assert errored > claude.messages.count_tokens(
        model=MODEL, system=SYSTEM, tools=TOOLS, messages=[*messages[:-1], {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use.id, "content": "the weather service is down"}]}],
    ).input_tokens  # is_error marks the result


def test_named_tool_streamed_and_not(claude):
    kwargs = dict(model=MODEL, tools=TOOLS, messages=ASK, max_tokens=16, extra_body=GREEDY, tool_choice={"type": "tool", "name": "get_time"})
    named = claude.messages.create(**kwargs)
    [time_use] = tool_uses(named)
    assert (named.stop_reason, time_use.name, [b.type for b in named.content]) == ("tool_use", "get_time", ["tool_use"])
    with claude.messages.stream(**kwargs) as stream:
        streamed = stream.get_final_message()
    [streamed_use] = tool_uses(streamed)
    assert (streamed.stop_reason, streamed_use.name, streamed_use.input) == ("tool_use", "get_time", time_use.input)
    assert streamed.usage.output_tokens == named.usage.output_tokens


def test_api_key_as_x_api_key_or_bearer(server, claude):
    bearer = anthropic.Anthropic(base_url=server.url, auth_token=KEY, max_retries=0, timeout=120)
    assert bearer.messages.count_tokens(model=MODEL, messages=ASK).input_tokens == claude.messages.count_tokens(
        model=MODEL, messages=ASK).input_tokens
    wrong = anthropic.Anthropic(base_url=server.url, api_key="not-the-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as err:
        wrong.messages.create(model=MODEL, messages=ASK, max_tokens=2)
    assert err.value.status_code == 401
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "authentication_error"
    assert "x-api-key" in err.value.body["error"]["message"]
    # the key as x-api-key works on the OpenAI routes too; their errors keep OpenAI's shape
    assert httpx.get(f"{server.url}/v1/models", headers={"x-api-key": KEY}).status_code == 200
    assert httpx.get(f"{server.url}/v1/models", headers={"x-api-key": "no"}).json()["error"]["type"] == "AuthenticationError"


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x/a.png"}}]}]),
         "messages[0].content[0].type 'image' is not supported"),
        (dict(messages=[{"role": "system", "content": "Hi"}]), "messages[0].role"),
        (dict(messages=[]), "messages must not be empty"),
        (dict(messages=[{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]}]),
         "a tool_result block cannot be in a assistant message"),
        (dict(messages=[{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]), "messages[0].content[0].tool_use_id"),
        (dict(messages=ASK, tools=TOOLS, tool_choice={"type": "tool", "name": "nope"}), "not among tools"),
        (dict(messages=ASK, tool_choice={"type": "any"}), "`tools` must be set"),
        (dict(messages=ASK, tools=[{"type": "web_search_20250305", "name": "web_search"}]), "server tool"),
        (dict(messages=ASK, tools=[{"name": "f"}]), "tools[0].input_schema"),
        (dict(messages=ASK, max_tokens=0), "max_tokens"),
        (dict(messages=ASK, max_tokens=5000), "max_model_len"),
        (dict(messages=ASK, system=[{"type": "image"}]), "system[0] must be a text block"),
    ],
)
def test_bad_input_is_400_with_anthropic_body(claude, kwargs, fragment):
    kwargs = {"model": MODEL, "max_tokens": 4, **kwargs}
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.create(**kwargs)
    body = err.value.body
    assert err.value.status_code == 400 and body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert fragment in body["error"]["message"], body


def test_other_errors_have_anthropic_bodies(claude, server):
    with pytest.raises(anthropic.NotFoundError) as err:
        claude.messages.create(model="claude-sonnet-4-5", messages=ASK, max_tokens=2)
    assert err.value.body["error"]["type"] == "not_found_error" and "claude-sonnet-4-5" in err.value.body["error"]["message"]
    url, auth = f"{server.url}/v1/messages", {"x-api-key": KEY}
    for body, fragment in ((b'{"model": "m", "messages": [', "not valid JSON"),
                           (b'{"model": "m", "messages": [{"role": "user", "content": "Hi"}]}', "max_tokens"),
                           (b'{"model": "m", "max_tokens": 2, "messages": "Hi"}', "messages")):
        r = httpx.post(url, content=body, headers={**auth, "content-type": "application/json"})
        assert r.status_code == 400 and r.json()["type"] == "error", r.text
        assert r.json()["error"]["type"] == "invalid_request_error" and fragment in r.json()["error"]["message"]
    r = httpx.post(f"{url}/count_tokens", json={"model": "m", "messages": [{"role": "user", "content": 5}]}, headers=auth)
    assert r.status_code == 400 and "messages[0].content" in r.json()["error"]["message"]
    r = httpx.get(url, headers=auth)
    assert r.status_code == 405 and r.json()["type"] == "error"
