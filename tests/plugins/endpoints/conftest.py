"""A real ``host serve`` subprocess on 127.0.0.1 for the serving tests (see helpers.run_server), the
official ``openai`` client on it and the served model's name. A module that needs other server
flags defines its own ``server`` fixture; ``client`` and ``model`` then follow it."""

from __future__ import annotations

from typing import Iterator

import openai
import pytest

from helpers import Server, run_server


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    with run_server(tmp_path_factory.mktemp("serve")) as s:
        yield s


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id
