"""The bounded store behind ``store`` / ``previous_response_id`` / ``GET`` and ``DELETE
/v1/responses/{id}`` (plugins/endpoints/responses_store.py), on a clock the test moves."""

from __future__ import annotations

import pytest

from host.plugins.endpoints.responses_store import ResponseStore


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def response(rid: str, text: str) -> dict:
    return {"id": rid, "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}]}


def test_size_bound_evicts_the_oldest():
    store = ResponseStore(2, 60)
    for rid in ("a", "b", "c"):
        assert store.put(rid, response(rid, rid), [])
    assert store.get("a") is None and len(store) == 2
    assert store.get("b").response["id"] == "b" and store.get("c") is not None


def test_ttl_expires_entries():
    clock = Clock()
    store = ResponseStore(10, 30, clock)
    store.put("old", response("old", "x"), [])
    clock.now += 20
    store.put("new", response("new", "y"), [])
    clock.now += 15  # "old" is 35 s old, "new" 15 s
    assert store.get("old") is None and store.get("new") is not None
    clock.now += 15
    assert store.get("new") is None and len(store) == 0


def test_delete_and_disabled_store():
    store = ResponseStore(3, 60)
    store.put("a", response("a", "x"), [])
    assert store.delete("a") and not store.delete("a") and store.get("a") is None
    off = ResponseStore(0, 60)
    assert not off.enabled and not off.put("a", response("a", "x"), []) and off.get("a") is None


def test_a_chain_outlives_its_first_response():
    store = ResponseStore(2, 60)
    user1 = {"type": "message", "role": "user", "content": "hi"}
    store.put("r1", response("r1", "hello"), [user1])
    first = store.get("r1").conversation()
    assert [i.get("role") for i in first] == ["user", "assistant"]
    user2 = {"type": "message", "role": "user", "content": "more"}
    store.put("r2", response("r2", "sure"), first + [user2])
    store.put("r3", response("r3", "other"), [])  # evicts r1
    assert store.get("r1") is None
    chain = store.get("r2").conversation()
    assert [i.get("role") for i in chain] == ["user", "assistant", "user", "assistant"]
    assert chain[0] is user1  # shared, not copied


@pytest.mark.parametrize("size, ttl", [(-1, 60), (1, 0)])
def test_bad_bounds(size, ttl):
    with pytest.raises(ValueError, match="size >= 0 and ttl > 0"):
        ResponseStore(size, ttl)
