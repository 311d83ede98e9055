"""Tool calling on /v1/chat/completions through the official openai client, against one real
``host serve --enable-auto-tool-choice --tool-call-parser hermes`` on SmolLM2-135M-Instruct (the
session's ``flags_server``).

The model knows nothing of tools: ``tool_choice`` "required" and named must still return
schema-valid calls (structured outputs enforce them); the calls are validated with
``jsonschema`` against each tool's own ``parameters``, never against our own output."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from helpers import Server

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
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Current time in a zone", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(flags_server) -> Server:
    """The session's ``flags_server`` (tests/conftest.py), started with these flags among others."""
    args = flags_server.proc.args
    assert "--enable-auto-tool-choice" in args and args[args.index("--tool-call-parser") + 1] == "hermes"
    return flags_server


def check_call(call, name: str | None = None) -> dict:
    assert call.type == "function"
    assert call.id.startswith("chatcmpl-tool-")
    assert call.function.name in SCHEMAS
    if name is not None:
        assert call.function.name == name
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name])
    return args


def test_named_function_and_its_stream(client, model):
    named = {"type": "function", "function": {"name": "get_time"}}
    resp = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice=named, max_tokens=40, temperature=0)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    args = check_call(call, "get_time")

    chunks = list(client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice=named, max_tokens=40, temperature=0, stream=True,
    ))
    deltas = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
    first = deltas[0]
    assert (first.index, first.type, first.function.name) == (0, "function", "get_time")
    assert first.id.startswith("chatcmpl-tool-") and first.function.arguments == ""
    assert all(d.index == 0 and d.id is None for d in deltas[1:])
    streamed = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(streamed) == args  # greedy: the same call as the non-streamed one
    assert [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason] == ["tool_calls"]


def test_required_and_its_stream(client, model):
    kwargs = dict(model=model, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=80, temperature=0, parallel_tool_calls=False)
    resp = client.chat.completions.create(**kwargs)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls  # parallel_tool_calls=False: one call
    check_call(call)
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    calls: dict[int, dict] = {}
    for c in chunks:
        for ch in c.choices:
            for tc in ch.delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"id": tc.id, "name": tc.function.name, "arguments": ""})
                entry["arguments"] += tc.function.arguments or ""
    assert list(calls) == [0]
    assert calls[0]["name"] == call.function.name and calls[0]["id"].startswith("chatcmpl-tool-")
    assert json.loads(calls[0]["arguments"]) == json.loads(call.function.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_none_returns_content(client, model):
    resp = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=6, temperature=0)
    msg = resp.choices[0].message
    assert isinstance(msg.content, str) and msg.content
    assert not msg.tool_calls
    assert resp.choices[0].finish_reason in ("stop", "length")


def test_auto_without_a_call_is_content(client, model):
    # the hermes parser reads the output; SmolLM2 answers in prose, so no call and the text stays content
    resp = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, max_tokens=6, temperature=0)
    msg = resp.choices[0].message
    assert "<tool_call>" not in (msg.content or "")
    assert not msg.tool_calls and isinstance(msg.content, str)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(tool_choice="required"), "`tools` must be set"),
        (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "not among tools"),
        (dict(tools=TOOLS, tool_choice="sometimes"), "tool_choice"),
        (dict(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}), "structured outputs"),
        (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}},
              extra_body={"structured_outputs": {"regex": "a+"}}), "structured outputs"),
        (dict(tools=[{"type": "function", "function": {"parameters": {}}}], tool_choice="required"), "tools[0].function.name"),
    ],
)
def test_inconsistent_input_is_400(client, model, kwargs, fragment):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model, messages=ASK, max_tokens=4, **kwargs)
    assert fragment in err.value.message


def test_agent_loop(client, model):
    """call -> tool result in the next turn -> a final answer in plain text."""
    messages = list(ASK)
    resp = client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=40, temperature=0,
    )
    [call] = resp.choices[0].message.tool_calls
    args = check_call(call, "get_time")
    messages.append(resp.choices[0].message.model_dump(exclude_none=True))
    result = f"It is 14:05 {args['zone']}."
    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    final = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=12, temperature=0)
    choice = final.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert isinstance(choice.message.content, str) and choice.message.content
    assert not choice.message.tool_calls
    prompt_tokens = final.usage.prompt_tokens
    bare = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=1, temperature=0)
    assert prompt_tokens > bare.usage.prompt_tokens + 10  # the call and its result are in the prompt


@pytest.mark.parametrize(
    "tool_calls, fragment",
    [
        ("get_weather", "messages[1].tool_calls must be a list"),
        ({"function": {"name": "get_weather"}}, "messages[1].tool_calls must be a list"),
        (["get_weather"], "messages[1].tool_calls[0] must be an object"),
        ([{"id": "c", "type": "function", "function": 5}], "messages[1].tool_calls[0].function must be an object"),
    ],
)
def test_malformed_history_tool_calls_are_400(client, model, tool_calls, fragment):
    """An assistant turn's ``tool_calls`` that is not a list of call objects (once a 500): a 400 naming it."""
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": tool_calls}, {"role": "user", "content": "and?"}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model, messages=messages, max_tokens=2)
    assert fragment in err.value.message and err.value.body["param"] == "messages[1].tool_calls"


# -- vLLM's own OpenAI-server tests (tests/entrypoints/openai/...) against host serve: token ids with tools ----------


@pytest.fixture(scope="module")
def tokenizer():
    import transformers

    from host.core.models.default_model import default_model_path

    return transformers.AutoTokenizer.from_pretrained(default_model_path())


def _tokenize(server: Server, body: dict) -> list[int]:
    import httpx

    resp = httpx.post(f"{server.url}/tokenize", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.json()["tokens"]


@pytest.mark.parametrize("tool_choice, max_tokens", [("auto", 12), ({"type": "function", "function": {"name": "get_weather"}}, 40)])
def test_return_token_ids_with_tools(client, model, server, tokenizer, tool_choice, max_tokens):
    """vLLM's test_chat_completion_with_tool_use (tests/entrypoints/openai/basic/
    test_return_token_ids.py), its assertions as written, plus: ``prompt_token_ids`` are the
    prompt ``/tokenize`` renders for the same messages and tools (the tools in it), ``token_ids``
    are what the logprobs and the usage count and decode to the reply (its text, or the call's
    arguments), and a stream sends the same ids (prompt ids in the first chunk only)."""
    messages = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What's the weather like in Paris?"}]
    kw = dict(model=model, messages=messages, tools=TOOLS, tool_choice=tool_choice, max_tokens=max_tokens, temperature=0)
    response = client.chat.completions.create(**kw, logprobs=True, extra_body={"return_token_ids": True})
    choice = response.choices[0]
    assert isinstance(choice.token_ids, list) and isinstance(response.prompt_token_ids, list)
    prompt_text = tokenizer.decode(response.prompt_token_ids)
    assert "You are a helpful assistant" in prompt_text and "What's the weather like in Paris?" in prompt_text
    assert len(tokenizer.decode(choice.token_ids)) > 0
    assert response.prompt_token_ids == _tokenize(server, {"messages": messages, "tools": TOOLS})
    assert "get_weather" in prompt_text and len(response.prompt_token_ids) == response.usage.prompt_tokens
    assert len(choice.token_ids) == response.usage.completion_tokens == len(choice.logprobs.content)
    reply = tokenizer.decode(choice.token_ids, skip_special_tokens=True)
    if choice.message.tool_calls:
        [call] = choice.message.tool_calls
        assert call.function.name == "get_weather" and json.loads(reply) == json.loads(call.function.arguments)
    else:
        assert choice.message.content == reply

    collected, first = [], True
    for chunk in client.chat.completions.create(**kw, stream=True, extra_body={"return_token_ids": True}):
        dump = chunk.model_dump()
        if first:
            assert chunk.prompt_token_ids == response.prompt_token_ids
            first = False
        else:
            assert "prompt_token_ids" not in dump, "Subsequent chunks should not have prompt_token_ids"
        if chunk.choices and "token_ids" in chunk.choices[0].model_dump():
            collected.extend(chunk.choices[0].token_ids)
    assert collected == choice.token_ids

    without = client.chat.completions.create(**{**kw, "max_tokens": 2}, logprobs=True, extra_body={"return_token_ids": False})
    assert without.choices[0].model_dump().get("token_ids") is None and without.model_dump().get("prompt_token_ids") is None


def test_tokenize_with_tools_renders_the_chat_prompt(client, model, server, tokenizer):
    """vLLM's test_tokenize_chat_with_tools (tests/entrypoints/openai/test_tokenization.py) on a
    template that has no ``tools`` (SmolLM2's): ``/tokenize`` gives the ids the chat route
    prompts with, the tools written into the system message (host's rule for such templates,
    docs/openai_api.md), where transformers' ``apply_chat_template(tools=...)`` drops them."""
    tools = [{"type": "function", "function": {"name": "get_weather",
                                               "parameters": {"type": "object", "properties": {"location": {"type": "string"}}}}}]
    for add_generation in (False, True):
        for continue_final in (False, True):
            if add_generation and continue_final:
                continue
            conversation = [{"role": "user", "content": "What's the weather like in Paris today?"}]
            if continue_final:
                conversation.append({"role": "assistant", "content": "Sure,"})
            options = {"add_generation_prompt": add_generation, "continue_final_message": continue_final}
            ids = _tokenize(server, {"messages": conversation, "tools": tools, **options})
            chat = client.chat.completions.create(model=model, messages=conversation, tools=tools, tool_choice="none", max_tokens=1,
                                                  extra_body={"return_token_ids": True, **options})
            assert ids == chat.prompt_token_ids
            assert '"get_weather"' in tokenizer.decode(ids)
            dropped = tokenizer.apply_chat_template(conversation, tools=tools, tokenize=True, return_dict=False, **options)
            assert dropped == tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=False, **options) != ids
