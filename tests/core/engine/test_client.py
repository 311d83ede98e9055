"""The multiprocess engine-core client's start-up leaves nothing behind when it fails."""

from __future__ import annotations

import tempfile

import pytest

from host.core.engine.client import _EngineProcess


def test_a_start_that_fails_to_spawn_removes_its_ipc_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(Exception):  # noqa: B017 - whatever pickling raises for a lambda
        _EngineProcess(lambda: None)  # a config that cannot be sent to a spawned process
    assert not list(tmp_path.glob("host-ipc-*"))
