"""Anthropic's error body on the Messages routes: ``{"type": "error", "error": {"type", "message"}}``.

Every error the server answers is built once, in OpenAI's shape (``{"error": {"message", "type",
"param", "code"}}``), by the route, the request validation, the API-key check, the body limit or
the last-resort 500. :class:`AnthropicErrorBodies` rewrites those bodies for the paths under
``/v1/messages``, so an Anthropic client gets its own shape whichever layer refused the request:
the status stays, the message stays, the ``type`` is Anthropic's name for the status
(:data:`ERROR_TYPES`)."""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

MESSAGES_PATH = "/v1/messages"

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
"""Anthropic's error ``type`` of each status; another 4xx is ``invalid_request_error``, another
5xx ``api_error``."""


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _rewritten(body: bytes, status: int) -> bytes:
    """The Anthropic body of an OpenAI-shaped error body; any other body unchanged."""
    try:
        value = json.loads(body)
    except ValueError:
        return body
    error = value.get("error") if isinstance(value, dict) else None
    if not isinstance(error, dict) or value.get("type") == "error" or not isinstance(error.get("message"), str):
        return body
    return json.dumps(anthropic_error_body(status, error["message"]), ensure_ascii=False).encode()


class AnthropicErrorBodies:
    """ASGI middleware: a JSON error response (status >= 400) on a ``/v1/messages`` path gets
    Anthropic's body (see the module's docstring); everything else passes through untouched."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path != MESSAGES_PATH and not path.startswith(MESSAGES_PATH + "/"):
            await self.app(scope, receive, send)
            return
        held: dict[str, Any] | None = None
        chunks: list[bytes] = []

        async def rewrite(message: dict[str, Any]) -> None:
            nonlocal held
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers") or ())
                if message["status"] >= 400 and headers.get(b"content-type", b"").startswith(b"application/json"):
                    held = message
                    return
            elif message["type"] == "http.response.body" and held is not None:
                chunks.append(message.get("body", b""))
                if message.get("more_body", False):
                    return
                body = _rewritten(b"".join(chunks), held["status"])
                headers = [(k, v) for k, v in held.get("headers") or () if k != b"content-length"]
                headers.append((b"content-length", str(len(body)).encode()))
                await send({**held, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
            await send(message)

        await self.app(scope, receive, rewrite)
