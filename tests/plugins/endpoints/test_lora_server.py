"""LoRA over HTTP (issue 18, deliverable 4): ONE ``host serve`` of a tiny llama checkpoint with
``--enable-lora --max-loras 1 --lora-modules a=... --enable-lora-runtime-updates --api-key``.

The reference is transformers + PEFT on the same weights and adapter directories (each adapter
made by PEFT itself, its weights randomised so it changes the greedy tokens); the client is the
official openai one. The checkpoint has no tokenizer: prompts are token ids and the default
model's tokenizer decodes them (ids < 300). The flag parsing and the routes behind the opt-in
are checked in-process, without an engine.
"""

from __future__ import annotations

import asyncio
import json
import shutil

import httpx
import openai
import pytest

from helpers import hf_greedy, hf_model, run_server

KEY = "lora-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
N = 6  # greedy tokens per request
# 2 full blocks of 8 tokens and a partial one: the prefix cache holds 16 of each prompt's tokens
PROMPTS = [[(7 * i + 3 * j + 11) % 290 + 5 for j in range(20)] for i in range(3)]
# the messages' text alone: "a b c d" is 4 ids under 300 in the default model's tokenizer
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
ATTN = ["q_proj", "v_proj"]
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


ADAPTERS = {  # name: (rank, target modules, seed); b-retrained is b with other weights
    "a": (4, ATTN, 1),
    "b": (8, ALL, 2),
    "b-retrained": (8, ALL, 3),
}


def make_adapters(base_path, root) -> tuple[dict[str, str], dict[str, list[list[int]]]]:
    """PEFT adapter directories (PEFT's own save_pretrained, random A and B weights) and the
    greedy tokens of every prompt under each (transformers + PEFT) and under the base model."""
    import copy

    import peft
    import torch

    base = hf_model(base_path)
    dirs, want = {}, {"base": [hf_greedy(base, p, N) for p in PROMPTS]}
    for name, (r, targets, seed) in ADAPTERS.items():
        model = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(r=r, lora_alpha=16, target_modules=targets, lora_dropout=0.0))
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for pname, param in model.named_parameters():
                if "lora_" in pname:
                    param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
        model.save_pretrained(str(root / name))
        dirs[name] = str(root / name)
        want[name] = [hf_greedy(model.eval(), p, N) for p in PROMPTS]
    return dirs, want


def broken_copy(src: str, dst, config: dict | None = None, drop: str | None = None) -> str:
    """A copy of adapter ``src`` with ``config`` merged into its adapter_config.json or the
    file ``drop`` missing."""
    shutil.copytree(src, dst)
    if config:
        path = dst / "adapter_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    if drop:
        (dst / drop).unlink()
    return str(dst)


@pytest.fixture(scope="module")
def setup(tiny_checkpoint, tmp_path_factory):
    """The checkpoint, the adapter directories and their reference tokens."""
    base = tiny_checkpoint("llama", lm_head_scale=4.0)
    root = tmp_path_factory.mktemp("lora-adapters")
    dirs, want = make_adapters(base, root)
    for name in ADAPTERS:
        assert want[name] != want["base"], f"adapter {name} does not change the greedy tokens: the test would prove nothing"
    assert want["b"] != want["b-retrained"]
    dirs["too-wide"] = broken_copy(dirs["a"], root / "too-wide", {"r": 16})
    dirs["embeddings"] = broken_copy(dirs["a"], root / "embeddings", {"target_modules": ["q_proj", "embed_tokens"]})
    dirs["no-weights"] = broken_copy(dirs["a"], root / "no-weights", drop="adapter_model.safetensors")
    return {"base": str(base), "dirs": dirs, "want": want, "serving": root / "serving"}


@pytest.fixture(scope="module")
def server(setup, tmp_path_factory):
    from host.core.models.default_model import resolve_model_path

    args = ["--model", setup["base"], "--served-model-name", "tiny", "--tokenizer", resolve_model_path("default"),
            "--max-model-len", "96", "--block-size", "8", "--enable-prompt-tokens-details", "--api-key", KEY,
            "--enable-lora", "--max-loras", "1", "--max-lora-rank", "8", "--lora-modules", f"a={setup['dirs']['a']}",
            "--enable-lora-runtime-updates", "--chat-template", CHAT_TEMPLATE]
    with run_server(tmp_path_factory.mktemp("lora-server"), args) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)


def complete(client: openai.OpenAI, model: str, prompt: list[int]) -> tuple[list[int], int]:
    """Greedy token ids of one prompt and the prompt tokens the prefix cache served."""
    out = client.completions.create(model=model, prompt=prompt, max_tokens=N, temperature=0,
                                    extra_body={"ignore_eos": True, "return_token_ids": True})
    return out.choices[0].model_extra["token_ids"], out.usage.prompt_tokens_details.cached_tokens


def post(server, path: str, body: dict, auth: bool = True) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=AUTH if auth else {}, timeout=30)


def test_models_lists_the_adapter_with_its_parent(client, setup):
    models = {m.id: m for m in client.models.list().data}
    assert list(models) == ["tiny", "a"]
    assert models["tiny"].model_extra["parent"] is None
    assert models["a"].model_extra["parent"] == "tiny" and models["a"].model_extra["root"] == setup["dirs"]["a"]


def test_model_a_equals_transformers_with_peft(client, setup):
    want = setup["want"]
    assert [complete(client, "a", p)[0] for p in PROMPTS] == want["a"]
    assert [complete(client, "tiny", p)[0] for p in PROMPTS] == want["base"]
    # the same adapter again: its full blocks are reused (2 of 8 tokens), none across adapters
    assert complete(client, "a", PROMPTS[0]) == (want["a"][0], 16)


def test_load_needs_the_api_key_and_then_serves_b(client, server, setup):
    body = {"lora_name": "b", "lora_path": setup["dirs"]["b"]}
    assert post(server, "/v1/load_lora_adapter", body, auth=False).status_code == 401
    assert post(server, "/v1/unload_lora_adapter", {"lora_name": "a"}, auth=False).status_code == 401
    done = post(server, "/v1/load_lora_adapter", body)
    assert done.status_code == 200 and "'b'" in done.text, done.text
    models = {m.id: m.model_extra for m in client.models.list().data}
    assert models["b"]["parent"] == "tiny" and models["b"]["root"] == setup["dirs"]["b"]
    # the prompt was cached by a and by the base model: b reuses neither's KV
    assert complete(client, "b", PROMPTS[0]) == (setup["want"]["b"][0], 0)


def test_concurrent_requests_to_two_adapters_with_max_loras_1_all_complete(server, setup):
    """a and b at once with one adapter slot: the scheduler holds one adapter's requests back
    until the other's finished (tests/core/scheduler/test_lora_admission.py); all complete."""
    want = setup["want"]

    async def run() -> list[list[int]]:
        aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
        calls = [aclient.completions.create(model=m, prompt=p, max_tokens=N, temperature=0,
                                            extra_body={"ignore_eos": True, "return_token_ids": True})
                 for p in PROMPTS for m in ("a", "b", "tiny")]
        outs = await asyncio.gather(*calls)
        await aclient.close()
        return [o.choices[0].model_extra["token_ids"] for o in outs]

    got = asyncio.run(run())
    assert got == [want[m][i] for i in range(len(PROMPTS)) for m in ("a", "b", "base")]
    # /metrics: vLLM's lora_requests_info, one series per (max_lora, waiting, running) seen
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    seen = [s.labels for f in text_string_to_metric_families(text) if f.name == "vllm:lora_requests_info" for s in f.samples]
    assert seen and all(s["max_lora"] == "1" for s in seen)
    assert all(len(s["running_lora_adapters"].split(",")) <= 1 for s in seen)  # never two adapters at once
    assert {s["running_lora_adapters"] for s in seen} >= {"a", "b"}


@pytest.mark.parametrize("name, path_key, status, reason", [
    ("c", "no-weights", 400, "has no adapter_model.safetensors"),
    ("c", "too-wide", 400, "r=16, larger than max_lora_rank=8"),
    ("c", "embeddings", 400, "embed_tokens"),
    ("c", None, 400, "does not exist"),
    ("a", "b", 400, "'a' is already loaded; unload it first"),
    ("tiny", "b", 400, "is the base model's name"),
])
def test_a_bad_adapter_is_a_400_naming_the_problem(client, server, setup, name, path_key, status, reason):
    path = setup["dirs"][path_key] if path_key else str(setup["serving"] / "nowhere")
    got = post(server, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
    assert got.status_code == status, got.text
    error = got.json()["error"]
    assert reason in error["message"] and error["code"] == status, error
    # the server keeps serving, and the registry is unchanged
    assert complete(client, "a", PROMPTS[1])[0] == setup["want"]["a"][1]
    assert [m.id for m in client.models.list().data] == ["tiny", "a", "b"]


def test_unknown_names_are_404s(client, server):
    with pytest.raises(openai.NotFoundError, match="The model `nope` does not exist; this server serves tiny, a, b"):
        client.completions.create(model="nope", prompt=PROMPTS[0], max_tokens=1)
    got = post(server, "/v1/unload_lora_adapter", {"lora_name": "nope"})
    assert got.status_code == 404 and "no LoRA adapter is loaded under the name 'nope'" in got.json()["error"]["message"]
    bad = post(server, "/v1/load_lora_adapter", {"lora_name": "x"})  # no lora_path
    assert bad.status_code == 400 and "lora_path" in bad.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="use_beam_search is not supported with a LoRA adapter"):
        client.completions.create(model="a", prompt=PROMPTS[0], max_tokens=2, n=2, extra_body={"use_beam_search": True})


def test_chat_selects_the_adapter_too(client, setup):
    # the reply is generated under adapter a: equal to completions on the same rendered ids
    messages = [{"role": "user", "content": "a b c d a b c d"}]
    out = client.chat.completions.create(model="a", messages=messages, max_tokens=N, temperature=0,
                                         extra_body={"ignore_eos": True, "return_token_ids": True})
    ids = out.model_extra["prompt_token_ids"]
    assert out.model == "a" and len(ids) == 8
    assert out.choices[0].model_extra["token_ids"] == complete(client, "a", ids)[0]
    assert out.choices[0].model_extra["token_ids"] != complete(client, "tiny", ids)[0]


def test_unload_then_reload_changed_files_under_the_same_name_and_path(client, server, setup):
    """The vLLM bug the content hash prevents: b is unloaded, its directory rewritten with new
    weights, and b loaded again from the same path: the new weights' tokens, no stale KV."""
    want = setup["want"]
    serving = setup["serving"] / "b"
    shutil.copytree(setup["dirs"]["b"], serving)
    assert complete(client, "b", PROMPTS[2])[0] == want["b"][2]  # b's KV of this prompt is cached
    # the same weights from another directory: the same adapter by content, its KV is reused
    assert post(server, "/v1/unload_lora_adapter", {"lora_name": "b"}).status_code == 200
    assert post(server, "/v1/load_lora_adapter", {"lora_name": "b", "lora_path": str(serving)}).status_code == 200
    assert complete(client, "b", PROMPTS[2]) == (want["b"][2], 16)

    assert post(server, "/v1/unload_lora_adapter", {"lora_name": "b"}).status_code == 200
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="b", prompt=PROMPTS[2], max_tokens=1)
    for f in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy(f"{setup['dirs']['b-retrained']}/{f}", serving / f)
    assert post(server, "/v1/load_lora_adapter", {"lora_name": "b", "lora_path": str(serving)}).status_code == 200
    assert complete(client, "b", PROMPTS[2]) == (want["b-retrained"][2], 0)  # new weights: none of the old KV
    assert [m.id for m in client.models.list().data] == ["tiny", "a", "b"]


# -- without a server: the flags and the routes behind the opt-in -------------------------------


@pytest.fixture
def serve(monkeypatch):
    """``host serve ARGS`` up to the point where the server would start (the settings run_server got)."""
    import dataclasses

    from typer.testing import CliRunner

    from host.core.entrypoints.cli import serve_cmd as serve_module
    from host.core.entrypoints.cli.main import app

    calls: list[dict] = []
    monkeypatch.setattr(serve_module, "run_server", lambda model, settings, **kw: calls.append(dataclasses.asdict(settings)))

    def invoke(*args: str, env: dict | None = None):
        result = CliRunner().invoke(app, ["serve", *args], env=env)
        assert result.exit_code == 0, result.output
        return calls[-1]

    return invoke


def test_serve_flags(serve):
    spec = json.dumps({"name": "sql", "path": "/adapters/sql", "base_model_name": "tiny"})
    api = serve("--enable-lora", "--lora-modules", "a=/adapters/a", "--lora-modules", spec)
    assert api["lora_modules"] == ["a=/adapters/a", spec] and api["enable_lora_runtime_updates"] is False
    assert serve("--enable-lora-runtime-updates")["enable_lora_runtime_updates"] is True
    assert serve(env={"HOST_ALLOW_RUNTIME_LORA_UPDATING": "1"})["enable_lora_runtime_updates"] is True


def test_the_registry_at_start(plugin_host, tiny_checkpoint, tmp_path, setup):
    """--lora-modules are validated before the engine starts (a bad one fails the start with the
    reason); without the opt-in the load/unload routes are 404s."""
    from starlette.testclient import TestClient

    from host.core.engine_args import EngineArgs
    from host.core.entrypoints.api_server import ServerSettings, build_app

    dirs = setup["dirs"]
    kwargs = dict(model=setup["base"], skip_tokenizer_init=True, max_model_len=64)
    config = EngineArgs(**kwargs, enable_lora=True, max_lora_rank=8).create_engine_config()
    spec = json.dumps({"name": "bee", "path": dirs["b"], "base_model_name": "other-name"})
    app = build_app(config, ServerSettings(lora_modules=[f"a={dirs['a']}", spec]), plugin_host, start_engine=False)
    test_client = TestClient(app)
    listed = {m["id"]: m for m in test_client.get("/v1/models").json()["data"]}
    assert listed["bee"]["parent"] == "other-name" and listed["a"]["root"] == dirs["a"]
    assert [app.state.lora_registry.get(n).lora_int_id for n in ("a", "bee")] == [1, 2]
    assert test_client.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": dirs["b"]}).status_code == 404
    assert test_client.post("/v1/unload_lora_adapter", json={"lora_name": "a"}).status_code == 404

    for modules, reason in [
        ([f"w={dirs['too-wide']}"], "--lora-modules 'w=" + dirs["too-wide"] + "': LoRA adapter"),
        (["just-a-name"], "is not name=path"),
        (['{"name": "x"}'], "needs a non-empty name and path"),
        (['{"name": "x", "path": "/p", "base_model_name": 3}'], "base_model_name=3 must be a model name"),
        ([f"a={dirs['a']}", f"a={dirs['b']}"], "names 'a' twice"),
        ([f"tiny={dirs['a']}"], "is the base model's name"),
    ]:
        with pytest.raises(ValueError) as err:
            build_app(config, ServerSettings(served_model_names=["tiny"], lora_modules=modules), plugin_host, start_engine=False)
        assert reason in str(err.value), str(err.value)
    plain = EngineArgs(**kwargs).create_engine_config()
    with pytest.raises(ValueError, match="start it with --enable-lora"):
        build_app(plain, ServerSettings(lora_modules=[f"a={dirs['a']}"]), plugin_host, start_engine=False)
