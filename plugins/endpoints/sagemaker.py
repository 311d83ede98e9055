"""``POST /invocations`` and ``GET``/``POST /ping``, SageMaker's entry points, as an endpoint plugin.

SageMaker sends every inference to one path, so the body's shape picks the route: a body with
``messages`` is a chat completion, one with ``prompt`` a completion. Each is validated and
answered by that route's own handler (:func:`.chat.create_chat_completion`,
:func:`.completions.create_completion`), streams and errors included, so ``/invocations``
behaves exactly as the route it stands for. A body with neither is a 400 naming both. Like every
route but liveness, version and metrics, it needs the API key when the server has one.
``/ping`` answers as ``/health`` does (SageMaker's health probe; it needs the key too).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import ValidationError

from host.plugins.endpoints.chat import create_chat_completion
from host.plugins.endpoints.completions import create_completion
from host.plugins.endpoints.protocol import ChatCompletionRequest, CompletionRequest
from host.plugins.endpoints.server_routes import health_response
from host.sdk import APIError, EndpointPlugin

ROUTES = (("messages", ChatCompletionRequest, create_chat_completion), ("prompt", CompletionRequest, create_completion))
"""(the key that identifies the shape, its request model, its handler), tried in order."""


async def invocations(raw: Request) -> Any:
    """Dispatch one SageMaker invocation by its body's shape (see the module)."""
    try:
        body = json.loads(await raw.body())
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object with messages (chat) or prompt (completion)")
    for key, model, handler in ROUTES:
        if key in body:
            try:
                request = model.model_validate(body)
            except ValidationError as exc:
                raise RequestValidationError([{**e, "loc": ("body", *e.get("loc", ()))} for e in exc.errors()]) from None
            return await handler(request, raw)
    raise APIError(
        400, "cannot tell which route this invocation is for: give messages (chat completions) or prompt (completions)",
        param="messages",
    )


async def ping(raw: Request) -> Response:
    """SageMaker's health probe: ``/health``'s answer."""
    return health_response(raw.app.state)


class InvocationsEndpoint(EndpointPlugin):
    name = "sagemaker_invocations"
    required_tasks = ("generate",)

    def attach_router(self, app: Any) -> None:
        router = APIRouter()
        router.add_api_route("/invocations", invocations, methods=["POST"], summary="SageMaker: a chat completion or a completion, by the body's shape")
        for method in ("GET", "POST"):  # one route each: the API description gets two operation ids
            router.add_api_route("/ping", ping, methods=[method], summary="SageMaker's health probe: /health's answer")
        app.include_router(router)

    def routes(self) -> list[tuple[str, str]]:
        return [("POST", "/invocations"), ("GET", "/ping"), ("POST", "/ping")]
