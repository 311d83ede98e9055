"""A third-party tool parser (tests/fixtures/toolparser, pip-installed, entry point
``host.tool_parsers``) selected with ``--tool-call-parser whole_output``, behind the
``deepseek_r1`` reasoning parser, on a real ``host serve`` through the openai client.

``allowed_token_ids`` limits SmolLM2 to ``</``, ``think``, ``>``, ``Hmm`` and `` Hello`` so that
its greedy output holds a ``</think>``; the reference for that output is Hugging Face
transformers' greedy decoding under the same restriction. The reasoning is the text before the
first ``</think>``; the rest is content, which the fixture parser reads as one call to the first
tool with ``{"text": <content, stripped>}``."""

from __future__ import annotations

import json
import subprocess
from typing import Iterator

import pytest
import torch

from helpers import HOST_BIN, Server, run_server, subprocess_env

PROMPT = [{"role": "user", "content": "Say: Hmm</think> Hello"}]
WORDS = ["</", "think", ">", "Hmm", " Hello"]
TOOLS = [
    {"type": "function", "function": {"name": "say", "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "other", "parameters": {"type": "object", "properties": {}}}},
]
STEPS = 10


@pytest.fixture(scope="module")
def server(tmp_path_factory, fixture_sites) -> Iterator[Server]:
    args = ["--enable-auto-tool-choice", "--tool-call-parser", "whole_output", "--reasoning-parser", "deepseek_r1"]
    with run_server(tmp_path_factory.mktemp("toolparser"), args, sites=[fixture_sites["toolparser"]]) as s:
        yield s


@pytest.fixture(scope="module")
def reference() -> tuple[list[int], str]:
    """The allowed tokens and transformers' greedy text under that restriction."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from host.core.models.default_model import default_model_path

    path = default_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    allowed = sorted({i for w in WORDS for i in tok.encode(w, add_special_tokens=False)})
    ids = tok(tok.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True), return_tensors="pt").input_ids
    mask = torch.full((model.config.vocab_size,), float("-inf"))
    mask[allowed] = 0
    out = []
    with torch.no_grad():
        for _ in range(STEPS):
            tok_id = int((model(ids).logits[0, -1] + mask).argmax())
            out.append(tok_id)
            ids = torch.cat([ids, torch.tensor([[tok_id]])], 1)
    return allowed, tok.decode(out)


def ask(client, model, allowed, include_reasoning=True, **kwargs):
    return client.chat.completions.create(
        model=model, messages=PROMPT, max_tokens=STEPS, temperature=0,
        extra_body={"allowed_token_ids": allowed, "include_reasoning": include_reasoning}, **kwargs,
    )


def test_reasoning_and_content(client, model, reference):
    allowed, text = reference
    reasoning, _, content = text.partition("</think>")
    assert reasoning and content  # the restriction made the model close its reasoning
    msg = ask(client, model, allowed).choices[0].message
    assert msg.reasoning_content == reasoning
    assert msg.model_extra["reasoning"] == reasoning
    assert msg.content == content
    assert not msg.tool_calls

    chunks = list(ask(client, model, allowed, stream=True))
    deltas = [ch.delta for c in chunks for ch in c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == reasoning
    assert "".join(d.content or "" for d in deltas) == content

    hidden = ask(client, model, allowed, include_reasoning=False).choices[0].message  # vLLM's switch
    assert hidden.content == content and getattr(hidden, "reasoning_content", None) is None


def test_third_party_parser_reads_the_content(client, model, reference):
    allowed, _ = reference
    # the tools change the prompt; "none" shows the content the parser is given under "auto"
    plain = ask(client, model, allowed, tools=TOOLS, tool_choice="none").choices[0].message
    reasoning, content = plain.reasoning_content, plain.content
    assert content and not plain.tool_calls
    choice = ask(client, model, allowed, tools=TOOLS).choices[0]  # tool_choice defaults to "auto"
    assert choice.message.reasoning_content == reasoning
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.function.name == "say" and call.id.startswith("chatcmpl-tool-")
    assert json.loads(call.function.arguments) == {"text": content.strip()}
    assert choice.finish_reason == "length"  # cut by max_tokens: not "tool_calls"

    chunks = list(ask(client, model, allowed, tools=TOOLS, stream=True))
    calls = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
    assert calls[0].function.name == "say" and calls[0].function.arguments == ""
    assert json.loads("".join(tc.function.arguments or "" for tc in calls)) == {"text": content.strip()}


def test_unknown_parser_fails_at_startup(tmp_path):
    proc = subprocess.run(
        [HOST_BIN, "serve", "--port", "1", "--tool-call-parser", "nope"],
        capture_output=True, text=True, timeout=120, env=subprocess_env([]),
    )
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "--tool-call-parser 'nope' is not a known parser" in out
    assert "hermes" in out and "pythonic" in out


def test_responses_reasoning_item_and_a_plugin_parsers_call(client, model, reference):
    """/v1/responses on the same server: the reasoning parser's split is a ``reasoning`` item,
    the content a message; under "auto" the third-party parser's call a ``function_call`` item."""
    allowed, text = reference
    reasoning, _, content = text.partition("</think>")
    kwargs = dict(model=model, input=PROMPT[0]["content"], max_output_tokens=STEPS, temperature=0, extra_body={"allowed_token_ids": allowed})
    resp = client.responses.create(**kwargs)
    assert [o.type for o in resp.output] == ["reasoning", "message"]
    assert resp.output[0].content[0].text == reasoning and resp.output_text == content
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert 0 < resp.usage.output_tokens_details.reasoning_tokens < resp.usage.output_tokens == STEPS
    with client.responses.stream(**kwargs) as stream:
        events = list(stream)
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == reasoning
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == content

    tools = [{"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"]} for t in TOOLS]
    plain = client.responses.create(**kwargs, tools=tools, tool_choice="none")  # the content the parser is given under "auto"
    called = client.responses.create(**kwargs, tools=tools)
    assert [o.type for o in called.output] == ["reasoning", "function_call"]
    assert called.output[0].content[0].text == plain.output[0].content[0].text
    call = called.output[1]
    assert call.name == "say" and json.loads(call.arguments) == {"text": plain.output_text.strip()}
