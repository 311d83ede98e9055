"""The prefill/decode (PD) disaggregation proxy: one OpenAI endpoint in front of prefill and
decode ``host serve`` instances (``host pd-proxy``).

Contract, per ``POST /v1/completions`` and ``POST /v1/chat/completions``:

1. the request goes to the next prefill instance (round-robin) with ``max_tokens=1`` (and
   ``max_completion_tokens=1`` for chat), ``stream=false``, ``n=1`` and
   ``kv_transfer_params={"do_remote_decode": true}``;
2. the ``kv_transfer_params`` of its response (the producer connector's answer, or ``null``
   without a connector: the decode side then recomputes the prompt) are set on the client's
   original request, which goes to the next decode instance; its response (SSE bytes when the
   client streams) is passed through unchanged;
3. an upstream error status passes through with its OpenAI error body (a body that is not one is
   wrapped into one); an instance that cannot be reached answers 502 (503 for ``/health``) with a
   message naming its URL. A client that disconnects closes the decode stream, which the decode
   server sees as a disconnect and aborts.

``GET /v1/models`` is a decode instance's; ``GET /health`` is 200 only when every instance's
``/health`` is."""

from __future__ import annotations

import contextlib
import itertools
import json
from typing import AsyncIterator

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from host.interfaces.errors import error_body

PASSED_HEADERS = ("authorization", "x-request-id")


def parse_urls(value: str, flag: str) -> list[str]:
    """``"http://a:1,http://b:2"`` -> the URLs without a trailing slash; each must be http(s)."""
    urls = [u.strip().rstrip("/") for u in value.split(",") if u.strip()]
    if not urls:
        raise ValueError(f"{flag}: no URL given; pass one or more comma-separated http://HOST:PORT URLs")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{flag}: {url!r} is not an http(s) URL; write it as http://HOST:PORT")
    return urls


def _error(status: int, message: str, type_: str) -> JSONResponse:
    return JSONResponse(error_body(message, type_, None, status), status_code=status)


def _upstream_error(resp_status: int, content: bytes, url: str) -> JSONResponse:
    """The upstream's error status with its body when that is an OpenAI error body, else one
    naming the upstream."""
    try:
        body = json.loads(content)
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return JSONResponse(body, status_code=resp_status)
    text = content.decode("utf-8", "replace")[:500]
    return _error(resp_status, f"{url} answered {resp_status}: {text}", "UpstreamError")


def build_app(prefill_urls: list[str], decode_urls: list[str], timeout_s: float = 600.0) -> FastAPI:
    """The proxy's ASGI app over the given instances (each ``http://HOST:PORT``)."""
    if not prefill_urls or not decode_urls:
        raise ValueError("pd proxy: needs at least one prefill and one decode URL (--prefill, --decode)")
    prefills = itertools.cycle(prefill_urls)
    decodes = itertools.cycle(decode_urls)
    state: dict[str, httpx.AsyncClient] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        state["client"] = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0), limits=limits)
        try:
            yield
        finally:
            await state["client"].aclose()

    app = FastAPI(title="host pd-proxy", lifespan=lifespan)

    def headers(request: Request) -> dict[str, str]:
        return {k: v for k, v in request.headers.items() if k.lower() in PASSED_HEADERS}

    async def proxied(request: Request, path: str, chat: bool) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the request body is not JSON; send an OpenAI request object", "BadRequestError")
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object", "BadRequestError")
        client = state["client"]
        hdrs = headers(request)

        prefill_body = {k: v for k, v in body.items() if k != "stream_options"}
        prefill_body.update(max_tokens=1, stream=False, n=1, kv_transfer_params={"do_remote_decode": True})
        if chat:
            prefill_body["max_completion_tokens"] = 1
        url = next(prefills)
        try:
            resp = await client.post(f"{url}{path}", json=prefill_body, headers=hdrs)
        except httpx.HTTPError as exc:
            return _error(502, f"prefill instance {url} cannot be reached ({type(exc).__name__}: {exc}); "
                               "check that it is up", "BadGatewayError")
        if resp.status_code != 200:
            return _upstream_error(resp.status_code, resp.content, url)
        try:
            kv_params = resp.json().get("kv_transfer_params")
        except ValueError:
            return _error(502, f"prefill instance {url} answered a body that is not JSON", "BadGatewayError")

        decode_body = dict(body, kv_transfer_params=kv_params)
        url = next(decodes)
        try:
            upstream = await client.send(client.build_request("POST", f"{url}{path}", json=decode_body, headers=hdrs),
                                         stream=True)
        except httpx.HTTPError as exc:
            return _error(502, f"decode instance {url} cannot be reached ({type(exc).__name__}: {exc}); "
                               "check that it is up", "BadGatewayError")
        if upstream.status_code != 200 or not body.get("stream"):
            try:
                content = await upstream.aread()
            finally:
                await upstream.aclose()
            if upstream.status_code != 200:
                return _upstream_error(upstream.status_code, content, url)
            return Response(content, status_code=200, media_type=upstream.headers.get("content-type", "application/json"))

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:  # the client went away or the stream ended: close the upstream connection
                await upstream.aclose()

        return StreamingResponse(relay(), status_code=200,
                                 media_type=upstream.headers.get("content-type", "text/event-stream"))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await proxied(request, "/v1/completions", chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await proxied(request, "/v1/chat/completions", chat=True)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        url = decode_urls[0]
        try:
            resp = await state["client"].get(f"{url}/v1/models", headers=headers(request))
        except httpx.HTTPError as exc:
            return _error(502, f"decode instance {url} cannot be reached ({type(exc).__name__}); check that it is up",
                          "BadGatewayError")
        if resp.status_code != 200:
            return _upstream_error(resp.status_code, resp.content, url)
        return Response(resp.content, media_type="application/json")

    @app.get("/health")
    async def health() -> Response:
        bad: list[str] = []
        for url in dict.fromkeys(prefill_urls + decode_urls):
            try:
                ok = (await state["client"].get(f"{url}/health", timeout=5.0)).status_code == 200
            except httpx.HTTPError:
                ok = False
            if not ok:
                bad.append(url)
        if bad:
            return _error(503, f"unhealthy instances: {', '.join(bad)}", "ServiceUnavailableError")
        return JSONResponse({"status": "ok", "prefill": prefill_urls, "decode": decode_urls})

    return app
