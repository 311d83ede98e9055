"""``POST /v1/responses``, ``GET`` / ``DELETE /v1/responses/{id}`` through the official openai
client (``client.responses``), against one real ``host serve --enable-auto-tool-choice
--tool-call-parser hermes`` on SmolLM2-135M-Instruct (the session's ``flags_server``).

The model knows nothing of tools: ``tool_choice`` "required" and named still return
schema-valid calls (structured outputs enforce them), validated with ``jsonschema`` against each
tool's own ``parameters``. Streams go through ``client.responses.stream``, whose accumulator
refuses an event out of order. Greedy decoding makes a request and its stream, and a turn
continued with ``previous_response_id`` and the same turn with its items resent, comparable."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from pydantic import BaseModel

from helpers import Server

TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET", "PST"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "name": "get_time", "description": "Current time in a zone", "parameters": TIME, "strict": True},
    {"type": "function", "name": "get_weather", "description": "Current weather in a city", "parameters": WEATHER, "strict": True},
]
SCHEMAS = {"get_time": TIME, "get_weather": WEATHER}
ASK = "What time is it in Paris?"
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def server(flags_server) -> Server:
    """The session's ``flags_server`` (tests/conftest.py), started with these flags among others."""
    args = flags_server.proc.args
    assert "--enable-auto-tool-choice" in args and args[args.index("--tool-call-parser") + 1] == "hermes"
    return flags_server


def check_call(item, name: str | None = None) -> dict:
    assert item.type == "function_call" and item.status == "completed"
    assert item.id.startswith("fc_") and item.call_id.startswith("call_")
    assert item.name == name if name is not None else item.name in SCHEMAS
    args = json.loads(item.arguments)
    jsonschema.validate(args, SCHEMAS[item.name])
    return args


def test_text_response_its_stream_and_the_chat_route_agree(client, model):
    kwargs = dict(model=model, instructions="Answer briefly.", input="Name a colour.", max_output_tokens=5, **GREEDY)
    resp = client.responses.create(**kwargs)
    assert resp.object == "response" and resp.id.startswith("resp_") and resp.model == model
    assert resp.status in ("completed", "incomplete") and resp.store is True and resp.instructions == "Answer briefly."
    [item] = resp.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    assert resp.output_text and item.content[0].type == "output_text"
    usage = resp.usage
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens and 0 < usage.output_tokens <= 5
    assert usage.output_tokens_details.reasoning_tokens == 0
    if resp.status == "incomplete":
        assert resp.incomplete_details.reason == "max_output_tokens" and usage.output_tokens == 5

    # the same prompt and greedy text as the chat route's
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a colour."}],
        max_tokens=5, **GREEDY,
    )
    assert chat.usage.prompt_tokens == usage.input_tokens
    assert chat.choices[0].message.content == resp.output_text

    with client.responses.stream(**kwargs) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]  # its response's status may be "incomplete" (as vLLM)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.id == final.id != resp.id
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == final.output_text == resp.output_text
    assert final.usage.output_tokens == usage.output_tokens and final.status == resp.status


def test_retrieve_delete_and_unknown_ids(client, model):
    resp = client.responses.create(model=model, input="Hi", max_output_tokens=2, **GREEDY)
    again = client.responses.retrieve(resp.id)
    assert again.model_dump() == resp.model_dump()
    assert client.responses.delete(resp.id) is None
    for call in (lambda: client.responses.retrieve(resp.id), lambda: client.responses.delete(resp.id)):
        with pytest.raises(openai.NotFoundError) as err:
            call()
        assert resp.id in err.value.message and err.value.body["param"] == "response_id"
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model=model, input="Hi", previous_response_id="resp_unknown", max_output_tokens=3)
    assert "resp_unknown" in err.value.message and err.value.body["param"] == "previous_response_id"
    unstored = client.responses.create(model=model, input="Hi", store=False, max_output_tokens=1, **GREEDY)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_two_turn_tool_loop(client, model):
    """call -> function_call_output -> final answer, continued with previous_response_id and
    with the items resent: the same prompt (the prefix cache serves the second), the same answer."""
    first = client.responses.create(
        model=model, input=ASK, tools=TOOLS, tool_choice={"type": "function", "name": "get_time"}, max_output_tokens=30, **GREEDY,
    )
    [call] = first.output
    args = check_call(call, "get_time")
    result = {"type": "function_call_output", "call_id": call.call_id, "output": f"It is 14:05 {args['zone']}."}
    turn = dict(model=model, tools=TOOLS, tool_choice="none", max_output_tokens=6, **GREEDY)
    chained = client.responses.create(previous_response_id=first.id, input=[result], **turn)
    assert chained.previous_response_id == first.id and chained.status in ("completed", "incomplete")
    assert [o.type for o in chained.output] == ["message"] and chained.output_text
    resent = client.responses.create(input=[{"role": "user", "content": ASK}, call.model_dump(exclude_none=True), result], **turn)
    assert resent.output_text == chained.output_text
    assert resent.usage.input_tokens == chained.usage.input_tokens
    assert chained.usage.input_tokens > first.usage.input_tokens + 10  # the call and its result are in the prompt
    # the full blocks of the chained prompt went to the prefix cache, and the resent prompt read
    # them back (all but a last token, which the engine always computes)
    n = chained.usage.input_tokens
    for usage in (chained.usage, resent.usage):
        assert usage.input_tokens_details.cached_tokens + usage.input_tokens_details.cache_write_tokens == n // 16 * 16  # --block-size 16
    assert resent.usage.input_tokens_details.cached_tokens == (n - 1) // 16 * 16


def test_required_tool_choice_streamed(client, model):
    with client.responses.stream(model=model, input=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                                 max_output_tokens=60, **GREEDY) as stream:
        events = list(stream)
        final = stream.get_final_response()
    [item] = final.output  # parallel_tool_calls=False: one call
    check_call(item)
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert deltas == done.arguments == item.arguments and done.item_id == item.id
    assert client.responses.retrieve(final.id).output[0].arguments == item.arguments  # a streamed response is stored too
    assert [e.type for e in events if e.type.startswith("response.output_item")] == ["response.output_item.added", "response.output_item.done"]
    assert not any(e.type.startswith("response.output_text") for e in events)


def test_json_schema_output_is_parsed(client, model):
    class City(BaseModel):
        name: str
        country: str

    parsed = client.responses.parse(model=model, input="Name a city as JSON.", text_format=City, max_output_tokens=40, **GREEDY)
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, City)
    assert parsed.text.format.type == "json_schema" and parsed.text.format.name == "City"
    anything = client.responses.create(model=model, input="Give me JSON.", text={"format": {"type": "json_object"}},
                                       max_output_tokens=12, **GREEDY)
    if anything.status == "completed":
        assert isinstance(json.loads(anything.output_text), dict)
    else:  # cut short: still the beginning of an object
        assert anything.output_text.lstrip().startswith("{")


@pytest.mark.parametrize(
    "kwargs, param, fragment",
    [
        (dict(input=[]), "input", "must not be empty"),
        (dict(input=[{"type": "web_search_call"}]), "input[0].type", "not supported"),
        (dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]), "input[0].content[0]", "input_image"),
        (dict(input=[{"type": "function_call_output", "output": "x"}]), "input[0].call_id", "non-empty string"),
        (dict(input=[{"type": "function_call", "name": "f", "call_id": "c", "arguments": {}}]), "input[0].arguments", "JSON"),
        (dict(input=[{"role": "robot", "content": "x"}]), "input[0].role", "robot"),
        (dict(input="x", tools=[{"type": "web_search"}]), "tools[0].type", "function tools"),
        (dict(input="x", tools=[{"type": "function", "parameters": {}}]), "tools[0].name", "non-empty"),
        (dict(input="x", tools=TOOLS, tool_choice={"type": "function", "name": "nope"}), "tool_choice", "not among tools"),
        (dict(input="x", tool_choice="required"), "tool_choice", "`tools` must be set"),
        (dict(input="x", tools=TOOLS, tool_choice={"type": "file_search"}), "tool_choice", "required"),
        (dict(input="x", tools=TOOLS, tool_choice="required", text={"format": {"type": "json_object"}}), "text.format", "tool_choice"),
        (dict(input="x", text={"format": {"type": "json_schema", "name": "a"}}), "text.format", "schema"),
        (dict(input="x", text={"format": {"type": "json_schema", "name": "a", "schema": {"type": "nonsense"}}}),
         "text.format.schema", "could not be compiled"),
        (dict(input="x", max_output_tokens=0), "max_output_tokens", "greater than or equal to 1"),
        (dict(input="x", max_output_tokens=5000), "max_output_tokens", "max_model_len=1024"),
        (dict(input="x", temperature="hot"), "temperature", "number"),
        (dict(input="x", background=True), "background", "not supported"),
        (dict(input="x", truncation="auto"), "truncation", "not supported"),
        (dict(input="x", top_logprobs=3), "top_logprobs", "not supported"),
        (dict(input="x", conversation="conv_1"), "conversation", "previous_response_id"),
        (dict(input=3), "input.", "valid string"),  # input.str / input.list: neither form
    ],
)
def test_bad_fields_are_400_naming_them(client, model, kwargs, param, fragment):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=model, max_output_tokens=kwargs.pop("max_output_tokens", 4), **kwargs)
    assert err.value.status_code == 400
    assert err.value.body["param"].startswith(param) if param.endswith(".") else err.value.body["param"] == param, err.value.body
    assert fragment in err.value.message, err.value.body


def test_store_flags(monkeypatch):
    from typer.testing import CliRunner

    from host.core.entrypoints.cli import serve_cmd
    from host.core.entrypoints.cli.main import app

    calls: list = []
    monkeypatch.setattr(serve_cmd, "run_server", lambda model, settings, **kw: calls.append(settings))
    result = CliRunner().invoke(app, ["serve", "--responses-store-size", "5", "--responses-store-ttl", "90"])
    assert result.exit_code == 0, result.output
    assert (calls[-1].responses_store_size, calls[-1].responses_store_ttl) == (5, 90.0)
    result = CliRunner().invoke(app, ["serve", "--responses-store-ttl", "0"])
    assert result.exit_code == 2 and "--responses-store-ttl" in result.output
