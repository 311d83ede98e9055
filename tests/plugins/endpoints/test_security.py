"""The HTTP findings of issue 13 against a real ``host serve``: the API key covers every route
that does work, the request-body limit (413), request-supplied chat templates (refused unless
trusted; bounded when trusted), generic 500 bodies on a kept-alive connection, the OpenAPI
schema's 400, and one log line per non-streaming disconnect."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import openai
import pytest

from helpers import run_server

KEY = "sekret"
NAME = ["--served-model-name", "m"]
MESSAGES = [{"role": "user", "content": "Hi"}]
NESTED_LOOP = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"


@pytest.fixture(scope="module")
def guarded_server(tmp_path_factory):
    """One server for the key, body-limit and trusted-template tests: ``--api-key`` guards the
    routes whichever templates the server trusts, and the templates' requests are small."""
    args = ["--api-key", KEY, "--max-request-bytes", "65536", "--trust-request-chat-template", *NAME]
    with run_server(tmp_path_factory.mktemp("guarded"), args) as server:
        yield server


def test_api_key_covers_every_working_route(guarded_server):
    server = guarded_server
    url = server.url
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1, 2]}),
                       ("/v1/completions", {"prompt": "hi", "max_tokens": 1}), ("/drain", {})):
        r = httpx.post(f"{url}{path}", json=body)
        assert r.status_code == 401 and r.json()["error"]["type"] == "AuthenticationError", path
    assert httpx.get(f"{url}/v1/plugins").status_code == 401
    for path in ("/health", "/version", "/metrics", "/openapi.json"):
        assert httpx.get(f"{url}{path}").status_code == 200, path
    auth = {"Authorization": f"Bearer {KEY}"}
    tok = httpx.post(f"{url}/tokenize", json={"prompt": "Hello world", "add_special_tokens": False}, headers=auth).json()
    assert tok["count"] == len(tok["tokens"]) > 0
    assert httpx.post(f"{url}/detokenize", json={"tokens": tok["tokens"]}, headers=auth).json()["prompt"] == "Hello world"

    # the body limit, from Content-Length and from a chunked body; the key is checked first
    big = {"prompt": "x" * 70_000, "max_tokens": 1}
    assert httpx.post(f"{url}/v1/completions", json=big).status_code == 401
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.APIStatusError) as err:
        client.completions.create(model="m", prompt="x" * 70_000, max_tokens=1)
    assert err.value.status_code == 413
    error = err.value.body if isinstance(err.value.body, dict) and "message" in err.value.body else err.value.body["error"]
    assert "--max-request-bytes" in error["message"] and error["code"] == 413

    def chunks():
        for _ in range(20):
            yield b"x" * 8192

    r = httpx.post(f"{url}/tokenize", content=chunks(), headers={**auth, "content-type": "application/json"})
    assert r.status_code == 413 and "65536" in r.json()["error"]["message"]
    # under the limit the same client is served
    assert client.completions.create(model="m", prompt="x" * 1000, max_tokens=1).choices[0].finish_reason == "length"

    # the schema documents what the server sends: 400 with the OpenAI error body, never 422
    schema = httpx.get(f"{url}/openapi.json").json()
    chat = schema["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert "422" not in chat and "400" in chat
    assert "422" not in str(schema) and "ErrorResponse" in schema["components"]["schemas"]


def test_request_chat_templates_are_refused_unless_trusted(hello_server):
    server = hello_server  # the session's server without --trust-request-chat-template
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    model = client.models.list().data[0].id
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=1,
                                       extra_body={"chat_template_kwargs": {"chat_template": NESTED_LOOP}})
    assert "--trust-request-chat-template" in str(err.value)
    # other template kwargs still work
    out = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=1,
                                         extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert out.choices[0].finish_reason == "length"


def test_trusted_request_templates_render_sandboxed_and_time_bounded(guarded_server):
    server = guarded_server
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=120)
    plain = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    out = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=1,
                                         extra_body={"chat_template_kwargs": {"chat_template": plain}})
    assert out.usage.prompt_tokens > 0
    with pytest.raises(openai.BadRequestError) as err:  # the sandbox refuses an escape
        client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=1, extra_body={
            "chat_template_kwargs": {"chat_template": "{{ messages.__class__.__mro__ }}"}})
    assert "unsafe" in str(err.value) or "could not render" in str(err.value)

    worst = [0.0]
    done = threading.Event()

    def poll() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            while not done.is_set():
                t = time.perf_counter()
                assert c.get("/health").status_code == 200
                worst[0] = max(worst[0], time.perf_counter() - t)
                time.sleep(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    start = time.perf_counter()
    try:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=1,
                                           extra_body={"chat_template_kwargs": {"chat_template": NESTED_LOOP}})
    finally:
        done.set()
        poller.join()
    took = time.perf_counter() - start
    print(f"nested-loop template refused after {took:.2f} s; worst /health latency meanwhile {worst[0] * 1000:.0f} ms")
    assert "ran for more than" in str(err.value)
    assert took < 60 and worst[0] < 1.0
    # the server is whole afterwards
    assert client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=1).choices


def _raw_get(sock: socket.socket, path: str) -> tuple[int, bytes]:
    """One HTTP/1.1 GET on an open connection: (status, body)."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    while len(body) < length:
        body += sock.recv(65536)
    return int(head.split()[1]), body


def test_500_is_generic_and_keeps_the_connection(hello_server):
    server = hello_server
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        status, body = _raw_get(sock, "/fixture/fail")
        assert status == 500
        import json

        message = json.loads(body)["error"]["message"]
        assert "request id" in message and "fixture secret detail" not in message and "RuntimeError" not in message
        rid = message.split("request id ")[1].split(")")[0]
        # the same connection still serves (keep-alive was not closed by the 500)
        assert _raw_get(sock, "/health")[0] == 200
        assert _raw_get(sock, "/fixture/fail")[0] == 500
    log = server.log()
    assert "fixture secret detail" in log and rid in log  # the detail is in the log, under the id


def test_a_non_streaming_disconnect_logs_one_line(hello_server):
    server = hello_server  # shared by the session: only the log written from here on counts
    start = len(server.log())
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 400, "ignore_eos": True}, timeout=1.0)
    deadline = time.monotonic() + 30
    while "client disconnected" not in server.log()[start:] and time.monotonic() < deadline:
        time.sleep(0.2)
    log = server.log()[start:]
    assert "client disconnected" in log
    assert "Traceback" not in log and "Exception in ASGI application" not in log
