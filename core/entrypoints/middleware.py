"""The API server's ASGI middlewares (API process): the API key, the request-body limit and the
last-resort 500.

All three are plain ASGI (no ``BaseHTTPMiddleware``), so streaming responses and disconnect
detection pass through untouched. Outermost first:

- :class:`ApiKeyMiddleware` — with ``--api-key`` every route needs ``Authorization: Bearer KEY``
  (OpenAI's clients) or ``x-api-key: KEY`` (Anthropic's) except :data:`OPEN_PATHS` (liveness, version, metrics and the API description); 401 otherwise,
  checked before the body is read.
- :class:`BodyLimitMiddleware` — a body over ``--max-request-bytes`` is refused with 413, from its
  ``Content-Length`` before anything is read and while a chunked body is being received, so a
  large body never reaches JSON parsing.
- :class:`InternalErrorMiddleware` — an exception no handler took becomes a 500 whose body says
  only "internal error" and a request id (the traceback goes to the log under that id). It
  answers instead of re-raising, so the keep-alive connection stays open (starlette's own
  ``ServerErrorMiddleware`` re-raises to the server, which then closes the connection).
"""

from __future__ import annotations

import hmac
import logging
import re
import uuid
from typing import Any, Awaitable, Callable

from starlette.responses import JSONResponse

from host.interfaces.errors import error_body

logger = logging.getLogger("host.api")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/health", "/version", "/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
"""What answers without the API key: none of these does work on behalf of a client."""

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers") or ():
        if key == name:
            return value
    return None


def request_id_of(scope: Scope) -> str:
    """The client's ``X-Request-Id`` when it is a plain token, else a fresh one."""
    given = _header(scope, b"x-request-id")
    if given is not None:
        text = given.decode("latin-1")
        if _REQUEST_ID.match(text):
            return text
    return uuid.uuid4().hex


API_KEY_HELP = "missing or wrong API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"


def api_key_given(headers: Any, api_key: str) -> bool:
    """Whether ``headers`` (ASGI ``(name, value)`` byte pairs, names lower-case) carry
    ``api_key`` as ``Authorization: Bearer KEY`` or as ``x-api-key: KEY``; compared in constant time."""
    bearer, plain = f"Bearer {api_key}".encode(), api_key.encode()
    ok = False
    for name, value in headers or ():
        if name == b"authorization":
            ok |= hmac.compare_digest(value, bearer)
        elif name == b"x-api-key":
            ok |= hmac.compare_digest(value, plain)
    return ok


class ApiKeyMiddleware:
    """401 for every path outside :data:`OPEN_PATHS` without the key (:func:`api_key_given`)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            if not api_key_given(scope.get("headers"), self.api_key):
                response = JSONResponse(error_body(API_KEY_HELP, "AuthenticationError", None, 401), status_code=401)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """413 for a request body over ``max_bytes``; the body is read here (at most ``max_bytes``)
    and replayed to the app, whose later ``receive`` calls (disconnect detection) pass through."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self, size: str) -> JSONResponse:
        limit = self.max_bytes
        return JSONResponse(
            error_body(
                f"the request body is {size} bytes, over this server's limit of {limit} bytes; "
                "send a smaller request or raise --max-request-bytes",
                "RequestTooLargeError", None, 413,
            ),
            status_code=413,
            headers={"connection": "close"},  # the unread rest of the body would follow
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > self.max_bytes:
            await self._too_large(declared.decode().strip())(scope, receive, send)
            return
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # a disconnect before the body ended
                pending: list[dict[str, Any]] = [message]
                break
            body = message.get("body", b"")
            total += len(body)
            if total > self.max_bytes:
                await self._too_large(f"more than {self.max_bytes}")(scope, receive, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                pending = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]
                break

        async def replay() -> dict[str, Any]:
            if pending:
                return pending.pop()
            return await receive()

        await self.app(scope, replay, send)


class InternalErrorMiddleware:
    """A generic 500 with a request id for an exception nothing else handled; the detail is
    logged. Once a response has started only the log line is possible."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:  # noqa: BLE001 - the last resort: log it, answer generically
            rid = request_id_of(scope)
            logger.error("internal error in %s %s (request id %s)", scope.get("method"), scope.get("path"), rid, exc_info=exc)
            if started:
                return
            response = JSONResponse(
                error_body(f"internal server error (request id {rid}); the server log has the details", "InternalServerError", None, 500),
                status_code=500,
                headers={"x-request-id": rid},
            )
            await response(scope, receive, send)
