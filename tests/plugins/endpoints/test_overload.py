"""Overload control through the official ``openai`` client: a bounded queue answers 429 with
``Retry-After`` (streams too, before any body), and a request's ``timeout`` ends it with
``finish_reason="abort"`` and frees its blocks. One server: ``--max-num-seqs 1`` (one request
runs at a time) and ``--max-queued-requests 1``."""

from __future__ import annotations

import threading
import time

import openai
import pytest

from helpers import metric_total, run_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    args = ["--max-num-seqs", "1", "--max-queued-requests", "1"]
    with run_server(tmp_path_factory.mktemp("overload"), args) as s:
        yield s


def _gauge(server, suffix: str) -> float:
    return metric_total(server.url, suffix)


def _wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _idle(server) -> bool:
    return all(_gauge(server, g) == 0 for g in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"))


def test_timeout_aborts_and_frees_blocks(server, client, model):
    long = dict(model=model, prompt="Once upon a time", max_tokens=900, extra_body={"timeout": 0.5, "ignore_eos": True})
    started = time.monotonic()
    out = client.completions.create(**long)
    assert out.choices[0].finish_reason == "abort"
    assert out.usage.completion_tokens < 900
    assert time.monotonic() - started < 30  # it ended at its deadline, not after 900 tokens
    chunks = list(client.completions.create(**long, stream=True))
    assert chunks[-1].choices[0].finish_reason == "abort"
    _wait_for(lambda: _idle(server))
    with pytest.raises(openai.BadRequestError, match="timeout"):
        client.completions.create(model=model, prompt="x", max_tokens=1, extra_body={"timeout": -1})


def test_full_queue_answers_429_with_retry_after(server, client, model):
    running = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Count to a thousand."}], max_tokens=900,
        stream=True, extra_body={"ignore_eos": True},
    )
    next(iter(running))  # the first request runs (it has a token): it no longer counts as queued
    queued_done = threading.Event()
    results: list[str] = []

    def queued() -> None:  # waits behind the running request (max-num-seqs 1)
        out = client.completions.create(model=model, prompt="Hello", max_tokens=2)
        results.append(out.choices[0].finish_reason)
        queued_done.set()

    thread = threading.Thread(target=queued)
    thread.start()
    try:
        _wait_for(lambda: _gauge(server, "num_requests_waiting") >= 1)
        for stream in (False, True):
            with pytest.raises(openai.RateLimitError) as exc:
                client.completions.create(model=model, prompt="Hi", max_tokens=2, stream=stream)
            assert exc.value.status_code == 429
            assert exc.value.response.headers["retry-after"] == "1"
            assert "--max-queued-requests" in exc.value.body["message"]
    finally:
        running.close()  # the client goes away: its request is aborted, the queued one runs
    thread.join(60)
    assert queued_done.is_set() and results == ["length"]
    _wait_for(lambda: _idle(server))
