"""``host serve`` as a vLLM launch script starts it: the model named as typed, ``--chat-template``,
``/tokenize``'s ``token_strs`` and ``continue_final_message``, ``/tokenizer_info``,
``/invocations`` and ``/load``, the error words vLLM's tests match — one server, started with those flags and an API key; the
reference is transformers on the same weights and tokenizer, and the official ``openai``
client's types."""

from __future__ import annotations

import threading
import time
from typing import Iterator

import httpx
import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

from helpers import Server, hf_greedy, hf_model, run_server

TYPED = "HuggingFaceTB/SmolLM2-135M-Instruct"
KEY = "sekret"
AUTH = {"Authorization": f"Bearer {KEY}"}
# ChatML without the default system prompt SmolLM2's own template adds: renders differ, so a test
# can tell which template was used; tools, when a request has them, in a system turn first (a
# template that renders tools, as Qwen's and Llama 3's do)
TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("compat")
    template = tmp / "chatml.jinja"
    template.write_text(TEMPLATE)
    args = [
        TYPED, "--api-key", KEY, "--chat-template", str(template), "--enable-tokenizer-info-endpoint",
        "--enable-server-load-tracking", "--trust-remote-code", "--disable-log-requests", "--seed", "1234",
        "--max-logprobs", "5", "--enable-chunked-prefill", "--tensor-parallel-size", "1",
        "--uvicorn-log-level", "info", "--disable-uvicorn-access-log",
    ]
    with run_server(tmp, args) as s:
        yield s


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def tokenizer():
    import transformers

    from host.core.models.default_model import default_model_path

    return transformers.AutoTokenizer.from_pretrained(default_model_path())


@pytest.fixture(scope="module")
def reference():
    from host.core.models.default_model import default_model_path

    return hf_model(default_model_path())


def chat_ids(tokenizer, messages, **options) -> list[int]:
    """The reference prompt ids of ``messages``: transformers renders, then tokenizes the text."""
    return tokenizer.encode(tokenizer.apply_chat_template(messages, tokenize=False, **options), add_special_tokens=False)


def post(server: Server, path: str, body: dict, headers: dict = AUTH) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=headers, timeout=60)


def test_the_model_is_served_under_the_name_typed(client, server):
    models = client.models.list().data
    assert [m.id for m in models] == [TYPED]
    from host.core.models.default_model import cache_dir

    assert models[0].root == TYPED and cache_dir() not in str(models[0].model_dump())  # no local path
    out = client.completions.create(model=TYPED, prompt="Hello", max_tokens=2)
    assert out.model == TYPED
    with pytest.raises(openai.NotFoundError, match="smollm2-135m-instruct-"):
        client.completions.create(model="smollm2-135m-instruct-b179c9523d0e", prompt="Hello", max_tokens=2)
    log = server.log()
    assert "--trust-remote-code has no effect here" in log and "--disable-log-requests has no effect here" in log
    assert "--tensor-parallel-size" not in log  # 1 is what host runs anyway


def test_chat_uses_the_chat_template_flag(client, tokenizer, reference):
    ids = chat_ids(tokenizer, MESSAGES, chat_template=TEMPLATE, add_generation_prompt=True)
    assert ids != chat_ids(tokenizer, MESSAGES, add_generation_prompt=True)
    out = client.chat.completions.create(model=TYPED, messages=MESSAGES, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    assert out.usage.prompt_tokens == len(ids)
    expected = hf_greedy(reference, ids, 8)
    assert out.choices[0].message.content == tokenizer.decode(expected, skip_special_tokens=True)


def test_tokenize_returns_token_strs(server, tokenizer):
    prompt = "Tokenize me, naïvely: 12345"
    body = post(server, "/tokenize", {"model": TYPED, "prompt": prompt, "return_token_strs": True}).json()
    ids = tokenizer.encode(prompt)
    assert body["tokens"] == ids and body["count"] == len(ids)
    assert body["token_strs"] == tokenizer.convert_ids_to_tokens(ids)
    assert post(server, "/tokenize", {"prompt": prompt}).json()["token_strs"] is None


def test_tokenize_messages_follow_the_chat_rendering(server, tokenizer):
    body = post(server, "/tokenize", {"messages": MESSAGES}).json()
    assert body["tokens"] == chat_ids(tokenizer, MESSAGES, chat_template=TEMPLATE, add_generation_prompt=True)
    partial = [*MESSAGES, {"role": "assistant", "content": "The capital of France is"}]
    body = post(server, "/tokenize", {"messages": partial, "continue_final_message": True, "add_generation_prompt": False}).json()
    expected = chat_ids(tokenizer, partial, chat_template=TEMPLATE, continue_final_message=True)
    assert body["tokens"] == expected
    assert tokenizer.decode(expected).endswith("The capital of France is")


def test_tokenizer_info(server, tokenizer):
    info = httpx.get(f"{server.url}/tokenizer_info", headers=AUTH).json()
    assert info["tokenizer_class"] == type(tokenizer).__name__
    assert info["model_max_length"] == tokenizer.model_max_length
    assert info["eos_token"] == tokenizer.eos_token and info["bos_token"] == tokenizer.bos_token
    assert info["chat_template"] == TEMPLATE  # the template in use: --chat-template's
    assert "name_or_path" not in info  # no local path


def test_invocations_dispatch_by_the_body_shape(server, tokenizer, reference):
    root = openai.OpenAI(base_url=server.url, api_key=KEY, max_retries=0)  # /invocations is not under /v1
    body = {"messages": MESSAGES, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    chat = root.post("/invocations", cast_to=ChatCompletion, body=body)
    ids = chat_ids(tokenizer, MESSAGES, chat_template=TEMPLATE, add_generation_prompt=True)
    assert chat.object == "chat.completion" and chat.model == TYPED
    assert chat.choices[0].message.content == tokenizer.decode(hf_greedy(reference, ids, 6), skip_special_tokens=True)
    prompt = "The capital of France is"
    body = {"prompt": prompt, "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    completion = root.post("/invocations", cast_to=Completion, body=body)
    assert completion.object == "text_completion"
    assert completion.choices[0].text == tokenizer.decode(hf_greedy(reference, tokenizer.encode(prompt), 5), skip_special_tokens=True)
    bad = post(server, "/invocations", {"input": "hi"})
    assert bad.status_code == 400 and "give messages (chat completions) or prompt (completions)" in bad.json()["error"]["message"]
    bad = post(server, "/invocations", {"prompt": "hi", "max_tokens": "many"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
    assert post(server, "/invocations", {"prompt": "hi"}, headers={}).status_code == 401  # behind the API key
    assert httpx.get(f"{server.url}/ping", headers=AUTH).status_code == 200  # SageMaker's probe: /health's answer
    assert httpx.post(f"{server.url}/ping", headers=AUTH).status_code == 200


def test_vllms_invocations_assertions(client, server):
    """vLLM's test_invocations (chat and completions): ``/invocations`` answers with the keys the
    official client's model of the route's answer has (``model_dump()``: every field it declares,
    null where unused), the route's own keys, and the same choices."""
    for create, request_args in (
        (client.chat.completions.create, {"model": TYPED, "messages": [{"role": "system", "content": "you are a helpful assistant"},
                                                                       {"role": "user", "content": "what is 1+1?"}],
                                          "max_completion_tokens": 5, "temperature": 0.0, "logprobs": False}),
        (client.completions.create, {"model": TYPED, "prompt": "Hello, my name is", "max_tokens": 5, "temperature": 0.0}),
    ):
        output = create(**request_args).model_dump()
        invocation_output = post(server, "/invocations", request_args).json()
        route = post(server, "/v1/chat/completions" if "messages" in request_args else "/v1/completions", request_args).json()
        assert output.keys() == invocation_output.keys() == route.keys()
        assert output["choices"] == invocation_output["choices"]


def test_vllms_error_texts(client):
    """The words vLLM's tests match in a 400: a seed outside 64 bits names pydantic's bound
    (test_long_seed), a missing or empty prompt (test_empty_prompt, and vLLM's "decoder prompt
    cannot be empty"), token ids outside the vocabulary (test_out_of_vocab_token_ids)."""
    for seed in [-(2**63) - 1, 2**63]:
        with pytest.raises(openai.BadRequestError) as exc_info:
            client.chat.completions.create(model=TYPED, messages=[{"role": "system", "content": "You are a helpful assistant."}],
                                           temperature=0, seed=seed)
        assert "greater_than_equal" in exc_info.value.message or "less_than_equal" in exc_info.value.message
    with pytest.raises(openai.BadRequestError, match="Either prompt or prompt_embeds must be provided and non-empty."):
        client.completions.create(model=TYPED, prompt=None, max_tokens=5, temperature=0.0, extra_body={"prompt_embeds": []})
    for prompt in ("", []):
        with pytest.raises(openai.BadRequestError, match="Either prompt or prompt_embeds must be provided and non-empty."):
            client.completions.create(model=TYPED, prompt=prompt, max_tokens=5)
    with pytest.raises(openai.BadRequestError, match="decoder prompt cannot be empty"):
        client.completions.create(model=TYPED, prompt=["Hi", ""], max_tokens=5)
    with pytest.raises(openai.BadRequestError, match="prompt_embeds is not supported"):  # docs/openai_api.md: refused
        client.completions.create(model=TYPED, prompt="Hi", max_tokens=5, extra_body={"prompt_embeds": "AAAA"})
    with pytest.raises(openai.BadRequestError, match=".*out of vocabulary.*"):
        client.completions.create(model=TYPED, prompt=[999999], max_tokens=5, temperature=0.0)


def test_load_counts_generation_requests_in_flight(client, server):
    def load() -> int:
        return httpx.get(f"{server.url}/load", headers=AUTH).json()["server_load"]

    assert load() == 0
    stream = client.chat.completions.create(model=TYPED, messages=MESSAGES, max_tokens=16, stream=True,
                                            extra_body={"ignore_eos": True})
    next(iter(stream))  # the request is running
    assert load() == 1
    done = threading.Event()
    threading.Thread(target=lambda: (list(stream), done.set()), daemon=True).start()
    assert done.wait(120)
    deadline = time.monotonic() + 10
    while load() != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert load() == 0


def test_routes_behind_a_flag_are_404_without_it(plugin_host, tiny_checkpoint):
    from starlette.testclient import TestClient

    from host.core.engine_args import EngineArgs
    from host.core.entrypoints.api_server import ServerSettings, build_app

    config = EngineArgs(model=str(tiny_checkpoint("llama")), skip_tokenizer_init=True, max_model_len=64).create_engine_config()
    test_client = TestClient(build_app(config, ServerSettings(), plugin_host, start_engine=False))
    assert test_client.get("/tokenizer_info").status_code == 404
    assert test_client.get("/load").status_code == 404


# -- vLLM's own OpenAI-server tests (tests/entrypoints/openai/...) against host serve: /tokenize with tools ----------


def test_tokenize_chat_with_tools(client, server, tokenizer):
    """vLLM's test_tokenize_chat_with_tools (tests/entrypoints/openai/test_tokenization.py), its
    assertions as written, on a template that renders ``tools`` (``--chat-template``): the ids are
    transformers' ``apply_chat_template(..., tools=tools)`` tokenized, and the chat route with the
    same tools prompts with them."""
    tools = [{"type": "function", "function": {"name": "get_weather",
                                               "parameters": {"type": "object", "properties": {"location": {"type": "string"}}}}}]
    for add_generation in (False, True):
        for add_special in (False, True):
            conversation = [{"role": "user", "content": "What's the weather like in Paris today?"}]
            for continue_final in (False, True):
                if add_generation and continue_final:
                    continue
                if continue_final:
                    conversation.append({"role": "assistant", "content": "Sure,"})
                options = {"add_generation_prompt": add_generation, "continue_final_message": continue_final}
                prompt = tokenizer.apply_chat_template(conversation, tools=tools, chat_template=TEMPLATE, tokenize=False, **options)
                tokens = tokenizer.encode(prompt, add_special_tokens=add_special)
                result = post(server, "/tokenize", {**options, "add_special_tokens": add_special, "messages": conversation,
                                                    "model": TYPED, "tools": tools}).json()
                assert result["tokens"] == tokens
                assert result["count"] == len(tokens) and result["max_model_len"] == 1024 and result["token_strs"] is None
                assert '"get_weather"' in prompt
                if not add_special:
                    assert tokens == tokenizer.apply_chat_template(conversation, tools=tools, chat_template=TEMPLATE, tokenize=True,
                                                                   return_dict=False, **options)
                    chat = client.chat.completions.create(model=TYPED, messages=conversation, tools=tools, max_tokens=1,
                                                          extra_body={"return_token_ids": True, **options})
                    assert chat.prompt_token_ids == tokens
