"""The other runner's routes, answered with a 400 naming the flag that would serve them.

On a pooling model (an encoder such as ``BertModel``, or a decoder with ``--convert embed``),
``/v1/completions``, ``/v1/chat/completions`` and ``/v1/responses`` name ``--runner generate``. On a generative
model, ``/v1/embeddings``, ``/v1/score`` and ``/rerank`` (and their aliases) name ``--convert
embed``; ``/pooling`` does too, except for an IO processor's request (``{"data": ...}``, the
processor named in ``io_processor`` or by ``--io-processor``), which runs through
:mod:`.io_processing` with ``generate`` (``json_schema_extract``, for example).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from host.plugins.endpoints.common import FastJSONResponse, check_model, engine_of
from host.plugins.endpoints.io_processing import IOProcessors, run_processor
from host.plugins.endpoints.pooling_routes import RERANK_PATHS, SCORE_PATHS, PoolingRequest
from host.sdk import APIError, EndpointPlugin

GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/responses")
POOLING_PATHS = ("/v1/embeddings", *SCORE_PATHS, *RERANK_PATHS)


def _refuse_generation(raw: Request) -> Any:
    raise APIError(
        400, f"{raw.url.path} generates text, but this server runs a pooling (embedding) model; serve a generative "
        "model with --runner generate for it, or use /v1/embeddings, /pooling, /v1/score, /rerank", param="model",
    )


def _refuse_pooling(raw: Request) -> Any:
    raise APIError(
        400, f"{raw.url.path} needs an embedding model, but this server runs a generative model; start it with "
        "--convert embed (its final hidden states pooled) or serve an embedding model", param="model",
    )


class PoolingModelRefusals(EndpointPlugin):
    """On a pooling model: the generation routes, each a 400 naming ``--runner generate``."""

    name = "pooling_model_refusals"
    required_tasks = ("embed",)

    def attach_router(self, app: Any) -> None:
        router = APIRouter()

        async def refuse(raw: Request) -> Any:
            return _refuse_generation(raw)

        for path in GENERATION_PATHS:
            router.add_api_route(path, refuse, methods=["POST"], include_in_schema=False)
        app.include_router(router)

    def routes(self) -> list[tuple[str, str]]:
        return [("POST", p) for p in GENERATION_PATHS]


class GenerativeModelRefusals(EndpointPlugin):
    """On a generative model: the pooling routes, each a 400 naming ``--convert embed``, and
    ``/pooling`` for IO processors that generate."""

    name = "generative_model_pooling"
    required_tasks = ("generate",)

    def attach_router(self, app: Any) -> None:
        processors = app.state.io_processors = IOProcessors(app.state.settings, app.state.config)
        router = APIRouter()

        async def refuse(raw: Request) -> Any:
            return _refuse_pooling(raw)

        async def pooling(body: PoolingRequest, raw: Request) -> Any:
            engine_of(raw)
            check_model(raw, body.model)
            name = processors.pick(body.io_processor) if body.data is not None else None
            if name is None:
                return _refuse_pooling(raw)
            return FastJSONResponse(await run_processor(raw, processors, name, body.data, pooling=False))

        for path in POOLING_PATHS:
            router.add_api_route(path, refuse, methods=["POST"], include_in_schema=False)
        router.add_api_route("/pooling", pooling, methods=["POST"], summary="An IO processor's answer (generative models)")
        app.include_router(router)

    def routes(self) -> list[tuple[str, str]]:
        return [("POST", p) for p in (*POOLING_PATHS, "/pooling")]
