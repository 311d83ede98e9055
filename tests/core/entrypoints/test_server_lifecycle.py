"""Server life cycle: the engine process dying (or stopping), the API process dying, API keys,
third-party endpoint plugins, a clean shutdown on SIGTERM, a failed start, and connection
limits."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time

import httpx
import openai
import pytest

from helpers import HOST_BIN, free_port, run_server, subprocess_env


def _engine_pid(server) -> int:
    return httpx.get(f"{server.url}/v1/plugins").json()["processes"]["engine"]["pid"]


def _running(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_engine_death_exits_the_server_after_failing_requests(tmp_path):
    """``--exit-on-engine-death`` (the default): the stream in flight fails in-band and ends with
    ``[DONE]``, then the server exits with code 1 for its supervisor to restart it."""
    with run_server(tmp_path) as server:
        engine_pid = _engine_pid(server)
        lines: list[str] = []

        def stream() -> None:
            with httpx.stream("POST", f"{server.url}/v1/completions", json={"prompt": "Count:", "max_tokens": 900, "stream": True, "ignore_eos": True}, timeout=60) as r:
                lines.extend(line for line in r.iter_lines() if line)

        t = threading.Thread(target=stream)
        t.start()
        time.sleep(2.0)
        os.kill(engine_pid, signal.SIGKILL)
        t.join(20)
        assert not t.is_alive()
        assert any('"error"' in line for line in lines) and lines[-1] == "data: [DONE]"
        assert server.proc.wait(30) == 1
        assert "--exit-on-engine-death" in server.log()


def _children(pid: int) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
        except (OSError, ValueError):
            pass
    return found


def test_sigkill_of_the_api_process_takes_the_engine_down(tmp_path):
    # TMPDIR: a SIGKILLed API process cannot remove its host-ipc-* directory; keep it in tmp_path
    with run_server(tmp_path, TMPDIR=str(tmp_path)) as server:
        engine_pid = _engine_pid(server)
        # a text of 1 MiB starts the tokenizer child process (plugins/endpoints/tokenizer_process.py)
        r = httpx.post(f"{server.url}/tokenize", json={"prompt": "word " * (1 << 18)}, timeout=120)
        assert r.status_code == 200 and r.json()["count"] >= 1 << 18
        children = _children(server.proc.pid)
        assert engine_pid in children and len(children) >= 2, children  # the engine and the tokenizer
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(10)
        deadline = time.monotonic() + 10
        while any(_running(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(engine_pid), "the engine process was orphaned"
        assert not any(_running(pid) for pid in children), "a child process of the API process was orphaned"


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory, fixture_sites):
    """One server for the tests that leave it running: the heartbeat (the engine is stopped,
    then resumed), the endpoint plugin that is installed but not allowlisted, and
    ``--async-scheduling``. No test here depends on another's traffic."""
    args = ["--engine-heartbeat-timeout", "2", "--async-scheduling"]
    with run_server(tmp_path_factory.mktemp("shared"), args, sites=[fixture_sites["endpoint"]]) as server:
        yield server


def test_a_stopped_engine_turns_health_503_within_the_heartbeat_timeout(shared_server):
    server = shared_server
    engine_pid = _engine_pid(server)
    time.sleep(3)  # idle: the heartbeat keeps /health at 200
    assert httpx.get(f"{server.url}/health").status_code == 200
    os.kill(engine_pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 15
        while httpx.get(f"{server.url}/health").status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        r = httpx.get(f"{server.url}/health")
        assert r.status_code == 503 and "no message from the engine process" in r.json()["error"]["message"]
    finally:
        os.kill(engine_pid, signal.SIGCONT)
    deadline = time.monotonic() + 15
    while httpx.get(f"{server.url}/health").status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert httpx.get(f"{server.url}/health").status_code == 200  # resumed: healthy again
    assert server.proc.poll() is None  # a stopped engine is not a dead one


def test_a_failed_start_leaves_no_ipc_dir(tmp_path):
    ipc_tmp = tmp_path / "tmp"
    ipc_tmp.mkdir()
    proc = subprocess.run(
        [HOST_BIN, "serve", "--port", str(free_port()), "--max-model-len", "1024", "--kv-cache-memory", "1KiB"],
        capture_output=True, text=True, env=subprocess_env([], TMPDIR=str(ipc_tmp)), timeout=180,
    )
    assert proc.returncode != 0 and "raise --kv-cache-memory" in proc.stderr  # it failed in the engine
    assert not list(ipc_tmp.glob("host-ipc-*"))


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    """One server for the key, header-timeout and SIGTERM tests (the SIGTERM test, last, stops it)."""
    args = ["--api-key", "sekret", "--served-model-name", "tiny-chat", "--header-read-timeout", "1"]
    with run_server(tmp_path_factory.mktemp("keyed"), args) as server:
        yield server


def test_half_open_connections_are_closed_after_the_header_read_timeout(keyed_server):
    server = keyed_server
    socks = []
    for i in range(50):
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" if i % 2 else b"")  # headers never end
        s.settimeout(15)
        socks.append(s)
    try:
        for s in socks:
            assert s.recv(100) == b"", "a half-open connection was not closed"
    finally:
        for s in socks:
            s.close()
    assert httpx.get(f"{server.url}/health").status_code == 200  # complete requests still served


def test_engine_death_fails_requests_fast_and_health_turns_503(tmp_path):
    with run_server(tmp_path, ["--no-exit-on-engine-death"]) as server:
        engine_pid = httpx.get(f"{server.url}/v1/plugins").json()["processes"]["engine"]["pid"]
        result: dict = {}

        def long_request() -> None:
            t0 = time.monotonic()
            try:
                r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "Count:", "max_tokens": 900, "ignore_eos": True}, timeout=60)
                result["status"] = r.status_code
                result["body"] = r.json()
            except httpx.HTTPError as exc:
                result["error"] = repr(exc)
            result["elapsed_after_kill"] = time.monotonic() - result.get("killed_at", t0)

        def streaming_request() -> None:
            try:
                with httpx.stream("POST", f"{server.url}/v1/completions", json={"prompt": "Count:", "max_tokens": 900, "stream": True, "ignore_eos": True}, timeout=60) as r:
                    result["stream_lines"] = [line for line in r.iter_lines() if line]
            except httpx.HTTPError as exc:
                result["stream_error"] = repr(exc)

        threads = [threading.Thread(target=long_request), threading.Thread(target=streaming_request)]
        for t in threads:
            t.start()
        time.sleep(2.0)  # both are generating
        result["killed_at"] = time.monotonic()
        os.kill(engine_pid, signal.SIGKILL)
        for t in threads:
            t.join(10)
        assert not any(t.is_alive() for t in threads), "a client hung after the engine died"
        assert result["elapsed_after_kill"] < 5.0
        assert result["status"] == 503 and "engine" in result["body"]["error"]["message"]
        assert any('"error"' in line for line in result["stream_lines"]) and result["stream_lines"][-1] == "data: [DONE]"
        assert httpx.get(f"{server.url}/health").status_code == 503
        r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi"})
        assert r.status_code == 503


def test_api_key_guards_v1_but_not_health(keyed_server):
    server = keyed_server
    assert httpx.get(f"{server.url}/health").status_code == 200
    r = httpx.get(f"{server.url}/v1/models")
    assert r.status_code == 401 and r.json()["error"]["type"] == "AuthenticationError"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0).models.list()
    good = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sekret")
    assert [m.id for m in good.models.list().data] == ["tiny-chat"]
    out = good.completions.create(model="tiny-chat", prompt="Hi", max_tokens=2)
    assert out.model == "tiny-chat"
    # start-up summary
    log = server.log()
    assert "platform: cpu" in log and "attention backend: cpu_paged" in log
    assert "plugins (engine process" in log and "API key required" in log


def test_third_party_endpoint_needs_the_allowlist(shared_server, hello_server):
    # shared_server has the endpoint plugin installed, without --plugins fixture_hello
    server = shared_server
    assert httpx.get(f"{server.url}/fixture/hello").status_code == 404
    log = server.log()
    assert "fixture_hello" in log and "--plugins fixture_hello" in log  # the warning says how
    server = hello_server  # the same plugin installed, and allowlisted with --plugins fixture_hello
    assert httpx.get(f"{server.url}/fixture/hello").json() == {"hello": "from a plugin"}
    assert httpx.post(f"{server.url}/fixture/embed").status_code == 404
    log = server.log()
    assert "'fixture_embed_only' skipped" in log and "embed" in log
    # the built-in API still works next to it
    assert httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200


def test_sigterm_stops_the_engine_process(keyed_server):
    server = keyed_server
    engine_pid = httpx.get(f"{server.url}/v1/plugins", headers={"Authorization": "Bearer sekret"}).json()["processes"]["engine"]["pid"]
    server.proc.send_signal(signal.SIGTERM)
    # uvicorn shuts down gracefully, then re-raises the signal it caught
    assert server.proc.wait(30) in (0, -signal.SIGTERM)
    assert "Application shutdown complete" in server.log()
    for _ in range(50):
        try:
            os.kill(engine_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the engine process outlived the server")


def test_async_scheduling_server_keeps_streams_apart(shared_server):
    """``--async-scheduling`` (the GPU default, off on CPU): concurrent streams that end at
    different steps, each forcing its own token, get exactly their own tokens, and the engine
    ends with nothing running and no KV in use."""
    import asyncio
    import re

    # shared_server runs with --async-scheduling
    server = shared_server
    assert "Asynchronous scheduling" in server.log()

    async def one(ac: openai.AsyncOpenAI, i: int) -> tuple[int, int, str, str | None]:
        target, n = 2000 + i, 2 + i
        stream = await ac.completions.create(
            model="", prompt=f"Item {i}:", max_tokens=n, temperature=0.7, stream=True,
            logit_bias={str(target): 100}, extra_body={"ignore_eos": True},
        )
        text, finish = "", None
        async for chunk in stream:
            for c in chunk.choices:
                text += c.text
                finish = c.finish_reason or finish
        return target, n, text, finish

    async def main() -> list:
        ac = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", timeout=120, max_retries=0)
        try:
            return await asyncio.wait_for(asyncio.gather(*(one(ac, i) for i in range(24))), 300)
        finally:
            await ac.close()

    for target, n, text, finish in asyncio.run(main()):
        assert finish == "length"
        assert text == httpx.post(f"{server.url}/detokenize", json={"tokens": [target] * n}).json()["prompt"]
    metrics = httpx.get(f"{server.url}/metrics").text
    for name in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
        assert float(re.search(rf"^{name}\{{[^}}]*\}} (\S+)$", metrics, re.M).group(1)) == 0
