"""Graceful drain of ``host serve``: SIGTERM or ``POST /drain`` stops admitting requests (503
with ``Retry-After``), lets those in flight finish within ``--shutdown-timeout``, aborts the
rest with a clean last chunk, and exits with the engine process."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import openai
import pytest

from helpers import run_server


def _engine_pid(server) -> int:
    return httpx.get(f"{server.url}/v1/plugins", headers=_auth(server)).json()["processes"]["engine"]["pid"]


def _auth(server) -> dict:
    return {"Authorization": "Bearer sekret"} if "--api-key" in server.proc.args else {}


def _wait_gone(pid: int, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


class _Streams:
    """``count`` streaming completions through the official client, each in a thread; records
    every chunk's finish_reason and whether the stream ended cleanly."""

    def __init__(self, server, count: int, max_tokens: int) -> None:
        self.client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sekret", max_retries=0, timeout=120)
        self.results: list[dict] = [{} for _ in range(count)]
        self.started = [threading.Event() for _ in range(count)]
        self.threads = [threading.Thread(target=self._one, args=(i, max_tokens)) for i in range(count)]
        for t in self.threads:
            t.start()

    def _one(self, i: int, max_tokens: int) -> None:
        res = self.results[i]
        res["tokens"], res["finish"] = 0, None
        try:
            stream = self.client.completions.create(
                model="", prompt=f"Story {i}:", max_tokens=max_tokens, stream=True, extra_body={"ignore_eos": True}
            )
            for chunk in stream:
                self.started[i].set()
                for c in chunk.choices:
                    res["tokens"] += 1 if c.text or c.finish_reason is None else 0
                    res["finish"] = c.finish_reason or res["finish"]
            res["clean"] = True
        except Exception as exc:  # noqa: BLE001 - recorded, asserted below
            res["error"] = repr(exc)
        finally:
            self.started[i].set()

    def wait_started(self) -> None:
        for e in self.started:
            assert e.wait(120), "a stream never started"

    def join(self, timeout: float) -> None:
        for t in self.threads:
            t.join(timeout)
        assert not any(t.is_alive() for t in self.threads), "a stream hung during the drain"


@pytest.fixture(scope="module")
def patient_server(tmp_path_factory):
    """``--shutdown-timeout 120``: the cancelled-stream test uses it first, then the SIGTERM test
    drains and stops it."""
    with run_server(tmp_path_factory.mktemp("patient"), ["--shutdown-timeout", "120"]) as server:
        yield server


def test_a_stream_cancelled_mid_flight_closes_without_an_internal_error(patient_server):
    """The root of the "aclose(): asynchronous generator is already running" error: a stream
    cancelled while its generator was suspended (a disconnect, or the server cancelling it)."""
    server = patient_server
    body = {"prompt": ["One:", "Two:"], "max_tokens": 900, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line).startswith("data: {")
    deadline = time.monotonic() + 10
    metrics = ""
    while time.monotonic() < deadline:
        metrics = httpx.get(f"{server.url}/metrics").text
        running = [ln for ln in metrics.splitlines() if ln.startswith(("host:num_requests_running", "vllm:num_requests_running"))]
        if running and all(ln.endswith(" 0.0") for ln in running):
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"the cancelled stream's requests kept running:\n{metrics[:2000]}")
    log = server.log()
    assert "aclose()" not in log and "already running" not in log


def test_sigterm_lets_streams_in_flight_finish_and_refuses_new_ones(patient_server):
    server = patient_server
    engine_pid = _engine_pid(server)
    streams = _Streams(server, 4, 48)
    streams.wait_started()
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "late", "max_tokens": 2})
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"].isdigit()
    assert r.json()["error"]["type"] == "ServiceUnavailableError" and "shutting down" in r.json()["error"]["message"]
    with pytest.raises(openai.APIStatusError) as info:
        streams.client.completions.create(model="", prompt="late", max_tokens=2)
    assert info.value.status_code == 503
    assert httpx.get(f"{server.url}/health").status_code == 503
    streams.join(120)
    for res in streams.results:
        assert res.get("clean") and res["finish"] == "length", res
    assert server.proc.wait(30) in (0, -signal.SIGTERM)
    assert _wait_gone(engine_pid), "the engine process outlived the drained server"
    assert "aclose()" not in server.log() and "Traceback" not in server.log()


@pytest.mark.parametrize("trigger", ["sigterm", "post"])
def test_drain_timeout_aborts_streams_with_a_clean_last_chunk(tmp_path, trigger):
    """The finding: SIGTERM with 16 streams in flight gave every stream an internal "aclose()"
    error labelled 400. Now each ends with ``finish_reason="abort"`` and ``[DONE]``."""
    count = 16 if trigger == "sigterm" else 4
    with run_server(tmp_path, ["--shutdown-timeout", "1", "--api-key", "sekret"]) as server:
        engine_pid = _engine_pid(server)
        streams = _Streams(server, count, 900)
        streams.wait_started()
        if trigger == "sigterm":
            server.proc.send_signal(signal.SIGTERM)
        else:
            assert httpx.post(f"{server.url}/drain").status_code == 401  # behind the key
            r = httpx.post(f"{server.url}/drain", headers=_auth(server))
            assert r.status_code == 202 and r.json()["draining"] is True
        streams.join(60)
        for res in streams.results:
            assert res.get("clean") and res["finish"] == "abort", res
            assert 0 < res["tokens"] < 900
        # a drain asked for over HTTP exits 0; after SIGTERM uvicorn re-raises the signal
        assert server.proc.wait(30) in ((0,) if trigger == "post" else (0, -signal.SIGTERM))
        assert _wait_gone(engine_pid)
        log = server.log()
        assert f"aborted {count} request(s)" in log
        assert "aclose()" not in log and "Traceback" not in log
