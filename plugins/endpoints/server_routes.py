"""The non-generation routes, as endpoint plugins: ``/v1/models``, ``/tokenize`` and
``/detokenize``, ``/health`` and ``/version``, ``/metrics`` (Prometheus) and ``/v1/plugins``
(what ``host plugins list --json`` prints, for every process of this server)."""

from __future__ import annotations

import os
import time
from typing import Any

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from host.plugins.endpoints.chat import normalize_messages
from host.plugins.endpoints.chat_template import apply_template
from host.plugins.endpoints.common import (
    FastJSONResponse,
    check_counts,
    check_model,
    encode_text,
    engine_of,
    off_loop,
    tokenizer_process,
)
from host.plugins.endpoints.protocol import DetokenizeRequest, TokenizeRequest
from host.plugins.endpoints.tokenizer_process import TokenizerProcess
from host.sdk import APIError, EndpointPlugin, error_response


class ModelsEndpoint(EndpointPlugin):
    name = "openai_models"

    def attach_router(self, app: Any) -> None:
        router = APIRouter()

        @router.get("/v1/models", summary="List served models")
        async def list_models(raw: Request) -> JSONResponse:
            state = raw.app.state
            created = int(state.started_at)
            return JSONResponse({
                "object": "list",
                "data": [
                    {"id": name, "object": "model", "created": created, "owned_by": "host",
                     "root": state.model_path, "max_model_len": state.max_model_len}
                    for name in state.served_model_names
                ],
            })

        app.include_router(router)

    def routes(self) -> list[tuple[str, str]]:
        return [("GET", "/v1/models")]


def _tokenize(tok: Any, body: TokenizeRequest, max_model_len: int, max_request_bytes: int, process: TokenizerProcess) -> Response:
    """``/tokenize``'s answer (CPU work: runs in the worker pool)."""
    if body.prompt is not None:
        text, special = body.prompt, body.add_special_tokens
    else:
        text = apply_template(
            tok, normalize_messages(body.messages), kwargs={}, trusted=False, max_request_bytes=max_request_bytes,
            add_generation_prompt=body.add_generation_prompt,
        )
        special = False
    if process.handles(text):  # the ids come back as JSON: no Python int is made of them here
        count, ids_json = process.encode_json(text, special)
        head = msgspec.json.encode({"count": count, "max_model_len": max_model_len})
        return FastJSONResponse.from_rendered(head[:-1] + b',"tokens":' + ids_json + b"}")
    ids = encode_text(tok, text, special)
    return FastJSONResponse({"count": len(ids), "max_model_len": max_model_len, "tokens": ids})


def _detokenize(tok: Any, tokens: list[int], vocab: int) -> JSONResponse:
    """``/detokenize``'s answer (CPU work: runs in the worker pool)."""
    bad = [t for t in tokens if not 0 <= t < vocab]
    if bad:
        raise APIError(400, f"token ids outside the vocabulary [0, {vocab}): {bad[:5]}", param="tokens")
    return JSONResponse({"prompt": tok.decode(tokens)})


class TokenizeEndpoint(EndpointPlugin):
    """``/tokenize`` and ``/detokenize``; the work runs off the event loop."""

    name = "tokenize"

    def attach_router(self, app: Any) -> None:
        router = APIRouter()

        @router.post("/tokenize", summary="Tokenize a prompt or chat messages")
        async def tokenize(body: TokenizeRequest, raw: Request) -> JSONResponse:
            engine = engine_of(raw)
            check_model(raw, body.model)
            if (body.prompt is None) == (body.messages is None):
                raise APIError(400, "give exactly one of prompt and messages", param="prompt")
            check_counts(body)
            state = raw.app.state
            return await off_loop(
                _tokenize, engine.tokenizer, body, state.max_model_len, state.settings.max_request_bytes, tokenizer_process(raw),
            )

        @router.post("/detokenize", summary="Turn token ids back into text")
        async def detokenize(body: DetokenizeRequest, raw: Request) -> JSONResponse:
            engine = engine_of(raw)
            check_model(raw, body.model)
            return await off_loop(_detokenize, engine.tokenizer, body.tokens, engine.config.model.hf_config.vocab_size)

        app.include_router(router)

    def routes(self) -> list[tuple[str, str]]:
        return [("POST", "/tokenize"), ("POST", "/detokenize")]


class HealthEndpoint(EndpointPlugin):
    name = "health"

    def attach_router(self, app: Any) -> None:
        router = APIRouter()

        @router.get("/health", summary="200 while the engine is alive and answering, 503 otherwise or while draining")
        async def health(raw: Request) -> Response:
            state = raw.app.state
            engine = getattr(state, "engine", None)
            if engine is None or not engine.is_healthy:
                reason = engine.dead_reason if engine is not None else "no engine"
                return error_response(503, f"engine is not healthy: {reason}", "ServiceUnavailableError")
            limit = state.settings.engine_heartbeat_timeout
            silent = engine.engine_silent_for
            if silent > limit:
                return error_response(
                    503, f"engine is not healthy: no message from the engine process for {silent:.0f} s "
                    f"(--engine-heartbeat-timeout {limit:g}); is it stopped or stuck?", "ServiceUnavailableError",
                )
            if state.drain.draining:
                return error_response(503, "the server is draining (shutting down)", "ServiceUnavailableError")
            return Response(status_code=200)

        @router.post("/drain", summary="Stop admitting requests, finish those in flight, then exit", status_code=202)
        async def drain(raw: Request) -> JSONResponse:
            state = raw.app.state
            key = state.settings.api_key
            if key and raw.headers.get("authorization") != f"Bearer {key}":
                raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", "AuthenticationError")
            started = state.drain.start("POST /drain")
            return JSONResponse(
                {"draining": True, "already_draining": not started, "in_flight": state.drain.in_flight,
                 "shutdown_timeout": state.drain.shutdown_timeout},
                status_code=202,
            )

        @router.get("/version", summary="The host version")
        async def version() -> JSONResponse:
            from host import __version__

            return JSONResponse({"version": __version__})

        app.include_router(router)

    def routes(self) -> list[tuple[str, str]]:
        return [("GET", "/health"), ("GET", "/version"), ("POST", "/drain")]


class MetricsEndpoint(EndpointPlugin):
    name = "metrics"

    def attach_router(self, app: Any) -> None:
        router = APIRouter()

        @router.get("/metrics", summary="Prometheus metrics")
        async def metrics(raw: Request) -> Response:
            """The registry the ``prometheus`` stat logger fills (``host.stat_loggers``)."""
            from prometheus_client import generate_latest

            registry = getattr(raw.app.state, "metrics_registry", None)
            if registry is None:
                return Response(b"", media_type="text/plain")
            return Response(generate_latest(registry), media_type="text/plain; version=0.0.4; charset=utf-8")

        app.include_router(router)

    def routes(self) -> list[tuple[str, str]]:
        return [("GET", "/metrics")]


class PluginsEndpoint(EndpointPlugin):
    name = "plugins"

    def attach_router(self, app: Any) -> None:
        router = APIRouter()

        @router.get("/v1/plugins", summary="Plugins loaded by this server's processes")
        async def plugins(raw: Request) -> JSONResponse:
            from host.sdk.runtime import get_plugin_host

            api = [dict(r.to_dict(), process_pid=os.getpid()) for r in get_plugin_host().list_records()]
            processes: dict[str, Any] = {"api": {"pid": os.getpid(), "plugins": api}}
            engine = getattr(raw.app.state, "engine", None)
            if engine is not None and engine.is_healthy:
                try:
                    records = await engine.utility("plugins", timeout=10)
                    processes["engine"] = {"pid": engine.engine_pid, "plugins": records}
                except Exception as exc:  # noqa: BLE001 - the listing still answers
                    processes["engine"] = {"pid": engine.engine_pid, "error": str(exc)}
            return JSONResponse({"processes": processes, "time": time.time()})

        app.include_router(router)

    def routes(self) -> list[tuple[str, str]]:
        return [("GET", "/v1/plugins")]
