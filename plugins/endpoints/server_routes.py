"""The non-generation routes, as endpoint plugins: ``/v1/models`` (the base model's names, then
each LoRA adapter with its ``parent``), ``/tokenize`` and
``/detokenize``, ``/tokenizer_info`` (with ``--enable-tokenizer-info-endpoint``), ``/health`` and
``/version``, ``/load`` (with ``--enable-server-load-tracking``), ``/metrics`` (Prometheus) and
``/v1/plugins`` (what ``host plugins list --json`` prints, for every process of this server: the
API process, the engine process and each worker process of an ``mp`` / ``ray`` executor).

A route behind a flag is not attached without it, so it answers 404 as on vLLM."""

from __future__ import annotations

import os
import time
from typing import Any

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from host.plugins.endpoints.chat import render_chat_text
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
            root = state.served_model_names[0]  # the served name, never the local path it resolved to
            data = [
                {"id": name, "object": "model", "created": created, "owned_by": "host",
                 "root": root, "parent": None, "max_model_len": state.max_model_len, "permission": []}
                for name in state.served_model_names
            ]
            registry = getattr(state, "lora_registry", None)
            for adapter in registry.adapters() if registry is not None else []:  # as vLLM lists them
                lora = adapter.lora_request
                data.append({"id": lora.lora_name, "object": "model", "created": created, "owned_by": "host",
                             "root": lora.lora_path, "parent": adapter.parent, "max_model_len": state.max_model_len,
                             "permission": []})
            return JSONResponse({"object": "list", "data": data})

        app.include_router(router)

    def routes(self) -> list[tuple[str, str]]:
        return [("GET", "/v1/models")]


def _tokenize(tok: Any, body: TokenizeRequest, max_model_len: int, settings: Any, process: TokenizerProcess) -> Response:
    """``/tokenize``'s answer (CPU work: runs in the worker pool). Messages are rendered as the
    chat route renders them (``--chat-template``, ``continue_final_message``, ``tools``,
    ``chat_template_kwargs``); ``add_special_tokens`` defaults to True for a prompt and False
    for messages, as on vLLM. ``token_strs`` is ``null`` unless ``return_token_strs``."""
    if body.prompt is not None:
        text = body.prompt
        special = True if body.add_special_tokens is None else body.add_special_tokens
    else:
        text = render_chat_text(tok, body, settings)
        special = bool(body.add_special_tokens)
    if process.handles(text) and not body.return_token_strs:  # ids as JSON: no Python int is made of them here
        count, ids_json = process.encode_json(text, special)
        head = msgspec.json.encode({"count": count, "max_model_len": max_model_len})
        return FastJSONResponse.from_rendered(head[:-1] + b',"tokens":' + ids_json + b',"token_strs":null}')
    ids = encode_text(tok, text, special)
    strs = tok.convert_ids_to_tokens(ids) if body.return_token_strs else None
    return FastJSONResponse({"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": strs})


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
            return await off_loop(_tokenize, engine.tokenizer, body, state.max_model_len, state.settings, tokenizer_process(raw))

        @router.post("/detokenize", summary="Turn token ids back into text")
        async def detokenize(body: DetokenizeRequest, raw: Request) -> JSONResponse:
            engine = engine_of(raw)
            check_model(raw, body.model)
            return await off_loop(_detokenize, engine.tokenizer, body.tokens, engine.config.model.hf_config.vocab_size)

        app.include_router(router)

    def routes(self) -> list[tuple[str, str]]:
        return [("POST", "/tokenize"), ("POST", "/detokenize")]


def _jsonable(value: Any) -> Any:
    """A tokenizer setting as JSON: an ``AddedToken`` as its text, containers item by item, any
    other object as its ``str``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    content = getattr(value, "content", None)  # tokenizers.AddedToken
    return content if isinstance(content, str) else str(value)


def tokenizer_info(tok: Any, chat_template: str | None) -> dict[str, Any]:
    """What ``/tokenizer_info`` answers, as vLLM does: ``tokenizer_class`` and the tokenizer's
    settings (its ``init_kwargs`` but private ones and file paths: ``model_max_length``, the
    special tokens, ``added_tokens_decoder``...), with ``chat_template`` the template in use
    (``--chat-template``, else the tokenizer's)."""
    info: dict[str, Any] = {
        k: _jsonable(v) for k, v in (getattr(tok, "init_kwargs", None) or {}).items()
        if not k.startswith("_") and k not in ("name_or_path", "vocab_file", "merges_file", "tokenizer_file")
    }
    info["tokenizer_class"] = type(tok).__name__
    info["model_max_length"] = _jsonable(getattr(tok, "model_max_length", info.get("model_max_length")))
    for name, token in (getattr(tok, "special_tokens_map", None) or {}).items():
        info[name] = _jsonable(token)
    template = chat_template if chat_template is not None else getattr(tok, "chat_template", None)
    if template is not None:
        info["chat_template"] = _jsonable(template)
    return info


class TokenizerInfoEndpoint(EndpointPlugin):
    """``GET /tokenizer_info``, attached only with ``--enable-tokenizer-info-endpoint`` (it shows
    the chat template and special tokens, which an operator may not want public)."""

    name = "tokenizer_info"

    def attach_router(self, app: Any) -> None:
        if not getattr(app.state.settings, "enable_tokenizer_info_endpoint", False):
            return
        router = APIRouter()

        @router.get("/tokenizer_info", summary="The tokenizer's class, limits, special tokens and chat template")
        async def info(raw: Request) -> JSONResponse:
            engine = engine_of(raw)
            return JSONResponse(tokenizer_info(engine.tokenizer, raw.app.state.settings.chat_template))

        app.include_router(router)

    def routes(self) -> list[tuple[str, str]]:
        return [("GET", "/tokenizer_info")]


LOAD_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/responses", "/invocations"})
"""The routes whose requests ``/load`` counts: those that generate (vLLM's load-aware routes)."""


class LoadCounter:
    """ASGI middleware: the generation requests (:data:`LOAD_PATHS`) in flight, from the request's
    arrival until its response (a stream included) has been sent or failed."""

    def __init__(self, app: Any, state: Any) -> None:
        self.app = app
        self.state = state
        state.server_load = 0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") not in LOAD_PATHS:
            await self.app(scope, receive, send)
            return
        self.state.server_load += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.state.server_load -= 1


class LoadEndpoint(EndpointPlugin):
    """``GET /load`` → ``{"server_load": N}``, the generation requests in flight; attached only
    with ``--enable-server-load-tracking`` (a load balancer polls it)."""

    name = "server_load"

    def attach_router(self, app: Any) -> None:
        if not getattr(app.state.settings, "enable_server_load_tracking", False):
            return
        app.add_middleware(LoadCounter, state=app.state)
        router = APIRouter()

        @router.get("/load", summary="The number of generation requests in flight")
        async def load(raw: Request) -> JSONResponse:
            return JSONResponse({"server_load": getattr(raw.app.state, "server_load", 0)})

        app.include_router(router)

    def routes(self) -> list[tuple[str, str]]:
        return [("GET", "/load")]


def health_response(state: Any) -> Response:
    """``/health``'s answer (SageMaker's ``/ping`` too): 200 while the engine is alive and
    answering, else a 503 saying why (dead, silent past ``--engine-heartbeat-timeout``, draining)."""
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


class HealthEndpoint(EndpointPlugin):
    name = "health"

    def attach_router(self, app: Any) -> None:
        router = APIRouter()

        @router.get("/health", summary="200 while the engine is alive and answering, 503 otherwise or while draining")
        async def health(raw: Request) -> Response:
            return health_response(raw.app.state)

        @router.post("/drain", summary="Stop admitting requests, finish those in flight, then exit", status_code=202)
        async def drain(raw: Request) -> JSONResponse:
            state = raw.app.state
            key = state.settings.api_key
            if key and raw.headers.get("authorization") != f"Bearer {key}" and raw.headers.get("x-api-key") != key:
                raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                               "AuthenticationError")
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
                    processes["engine"] = {"pid": engine.engine_pid, "plugins": [r for r in records if r.get("process") != "worker"]}
                    # worker processes (the mp and ray executors) report their own records
                    for row in records:
                        if row.get("process") == "worker":
                            entry = processes.setdefault(f"worker {row.get('rank', 0)}", {"pid": row.get("process_pid"), "plugins": []})
                            entry["plugins"].append(row)
                except Exception as exc:  # noqa: BLE001 - the listing still answers
                    processes["engine"] = {"pid": engine.engine_pid, "error": str(exc)}
            return JSONResponse({"processes": processes, "time": time.time()})

        app.include_router(router)

    def routes(self) -> list[tuple[str, str]]:
        return [("GET", "/v1/plugins")]
