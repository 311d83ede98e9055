"""Which IO processor a server uses: --io-processor, else the model's io_processor_plugin, else
none; a name no plugin registered fails the start naming the registered ones, a request's
unknown name is a 400. (The processors run through a server in test_embeddings.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from host.core.entrypoints.api_server import ServerSettings
from host.plugins.endpoints.io_processing import IOProcessors
from host.sdk import APIError
from host.sdk.testing import isolated_plugin_host


@pytest.fixture(autouse=True)
def builtins_loaded():
    with isolated_plugin_host(builtins=True) as host:
        yield host


def _config(**hf):
    return SimpleNamespace(model=SimpleNamespace(hf_config=SimpleNamespace(**hf)))


def test_the_flag_wins_over_the_model_config():
    assert IOProcessors(ServerSettings(io_processor="text_chunks"), _config(io_processor_plugin="json_schema_extract")).default == "text_chunks"
    assert IOProcessors(ServerSettings(), _config(io_processor_plugin="json_schema_extract")).default == "json_schema_extract"
    assert IOProcessors(ServerSettings(), _config()).default is None


def test_an_unregistered_name_fails_the_start_listing_the_registered_ones():
    with pytest.raises(ValueError, match=r"--io-processor asks for the IO processor 'nope'.*json_schema_extract, text_chunks"):
        IOProcessors(ServerSettings(io_processor="nope"), _config())
    with pytest.raises(ValueError, match=r"config.json \(io_processor_plugin\)"):
        IOProcessors(ServerSettings(), _config(io_processor_plugin="nope"))


def test_a_request_naming_an_unknown_processor_is_a_400():
    procs = IOProcessors(ServerSettings(), _config())
    assert procs.pick(None) is None and procs.pick("text_chunks") == "text_chunks"
    with pytest.raises(APIError) as err:
        procs.pick("nope")
    assert err.value.status == 400 and err.value.param == "io_processor" and "text_chunks" in err.value.message
