"""A third-party model architecture, pip-installed from tests/fixtures/olmo2 (OLMo 2 written on
host.sdk.models and registered through the ``host.models`` group): ``host plugins list`` shows it
as native, ``host serve`` serves it over HTTP with transformers' greedy tokens, and the model
conformance suite passes on it (in this process, with the installed package on the path)."""

from __future__ import annotations

import json

import openai
import pytest
import transformers

from helpers import hf_greedy, on_sys_path, run_host, run_server
from host.sdk.testing import ModelConformance

PROMPTS = [[5, 17, 42, 9, 101, 77, 3, 250, 31, 64], [200, 8, 8, 13, 2]]
N = 8
SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=320, max_position_embeddings=128, initializer_range=0.1)


def olmo2_config():
    return transformers.Olmo2Config(**SHAPE)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny random OLMo 2 checkpoint and transformers' greedy tokens for PROMPTS."""
    import torch

    torch.manual_seed(0)
    model = transformers.Olmo2ForCausalLM(olmo2_config()).eval()
    path = tmp_path_factory.mktemp("olmo2") / "tiny-olmo2"
    model.save_pretrained(path)
    return str(path), [hf_greedy(model, p, N) for p in PROMPTS]


def test_listed_as_native_from_its_plugin_and_served_over_http(fixture_sites, checkpoint, tmp_path):
    from host.core.models.default_model import resolve_model_path

    site = fixture_sites["olmo2"]
    path, want = checkpoint
    listed = run_host(["plugins", "list", "--json"], [site])
    assert listed.returncode == 0, listed.stderr
    models = {m["architecture"]: m for m in json.loads(listed.stdout)["models"]}
    assert models["Olmo2ForCausalLM"] == {
        "architecture": "Olmo2ForCausalLM", "implementation": "native", "plugin": "host.models:fixture_olmo2",
        "target": "host_fixture_olmo2.model:Olmo2ForCausalLM",
    }
    assert models["LlamaForCausalLM"]["plugin"] == "host.models:builtin_models"
    assert models["GPTNeoXForCausalLM"]["implementation"] == "transformers"  # no native one: the fallback
    args = ["--model", path, "--served-model-name", "olmo", "--tokenizer", resolve_model_path("default"),
            "--max-model-len", "96", "--block-size", "8"]
    with run_server(tmp_path, args, sites=[site]) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
        got = [
            client.completions.create(model="olmo", prompt=p, max_tokens=N, temperature=0,
                                      extra_body={"ignore_eos": True, "return_token_ids": True}).choices[0].model_extra["token_ids"]
            for p in PROMPTS
        ]
    assert got == want


@pytest.fixture
def olmo2_plugin(fixture_sites):
    with on_sys_path(fixture_sites["olmo2"]):
        import host_fixture_olmo2

        yield host_fixture_olmo2


class TestOlmo2Conformance(ModelConformance):
    """The suite on the fixture (registered in memory from the installed package; it declares no
    tensor parallelism, so that check skips)."""

    architecture = "Olmo2ForCausalLM"

    @pytest.fixture(autouse=True)
    def _plugin(self, olmo2_plugin):
        type(self).plugin_module = olmo2_plugin

    def config(self):
        return olmo2_config()
