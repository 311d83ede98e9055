"""HTTP errors with OpenAI-style bodies, shared by the API server's frame and every endpoint
plugin.

Raise :class:`APIError` from a route: the server answers with ``status`` and the body
``{"error": {"message", "type", "param", "code"}}`` that OpenAI clients parse. Build the same
body without raising with :func:`error_body` / :func:`error_response`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi.responses import JSONResponse


class APIError(Exception):
    """An error with an HTTP status and an OpenAI-style body; ``code`` defaults to the status
    and ``headers`` are sent with the response."""

    def __init__(
        self, status: int, message: str, type_: str = "BadRequestError", param: str | None = None, code: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code if code is not None else status
        self.headers = headers  # extra response headers, e.g. Retry-After on a 429


def error_body(message: str, type_: str, param: str | None, code: Any) -> dict[str, Any]:
    """``{"error": {...}}`` as OpenAI's API returns it."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(status: int, message: str, type_: str = "BadRequestError", param: str | None = None, code: Any = None) -> JSONResponse:
    """A ``JSONResponse`` with ``status`` and the OpenAI-style body (``code`` defaults to the
    status)."""
    from fastapi import responses  # imported here: only the API process needs fastapi

    return responses.JSONResponse(error_body(message, type_, param, code if code is not None else status), status_code=status)
