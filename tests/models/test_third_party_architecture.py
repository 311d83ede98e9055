"""A third-party model architecture, pip-installed from tests/fixtures/olmo2 (OLMo 2 written on
host.sdk.models and registered through the ``host.models`` group): ``host plugins list`` shows it
as native from its plugin, and the model conformance suite passes on it, in this process with the
installed package on the path: an engine serves it with transformers' greedy tokens and logprobs
(prefix caching and chunked prefill on)."""

from __future__ import annotations

import json

import pytest
import transformers

from helpers import on_sys_path, run_host
from host.sdk.testing import ModelConformance, isolated_plugin_host

SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=320, max_position_embeddings=128, initializer_range=0.1)


def olmo2_config():
    return transformers.Olmo2Config(**SHAPE)


def test_listed_as_native_from_its_plugin(fixture_sites):
    listed = run_host(["plugins", "list", "--json", "--all"], [fixture_sites["olmo2"]])
    assert listed.returncode == 0, listed.stderr
    models = {m["architecture"]: m for m in json.loads(listed.stdout)["models"]}
    assert models["Olmo2ForCausalLM"] == {
        "architecture": "Olmo2ForCausalLM", "implementation": "native", "plugin": "host.models:fixture_olmo2",
        "target": "host_fixture_olmo2.model:Olmo2ForCausalLM",
    }
    assert models["LlamaForCausalLM"]["plugin"] == "host.models:builtin_models"
    assert models["GPTNeoXForCausalLM"]["implementation"] == "transformers"  # no native one: the fallback


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
        # a plugin host of the built-ins only, for the test: the global one must not discover the
        # installed fixture while its site is on the path (later modules would find it native)
        type(self).plugin_module = olmo2_plugin
        with isolated_plugin_host():
            yield

    def config(self):
        return olmo2_config()
