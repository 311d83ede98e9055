"""A real ``host serve`` subprocess on 127.0.0.1 for the serving tests (see helpers.run_server), used by
tests/conftest.py's ``client`` and ``model``. A module that needs other server flags defines its own
``server`` fixture; ``client`` and ``model`` then follow it. Modules whose flags do not touch each
other's requests share a session server (``flags_server``, tests/conftest.py)."""

from __future__ import annotations

from typing import Iterator

import pytest

from helpers import Server, run_server


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    with run_server(tmp_path_factory.mktemp("serve")) as s:
        yield s

