"""The HTTP server: a FastAPI app assembled from endpoint plugins, in front of an engine-core
process.

The core owns only the frame: error handling (every error is an OpenAI-style body; a 500 says
only "internal error" and a request id, the detail is logged), the middlewares of
``core/entrypoints/middleware.py`` (the API key, as a bearer token or ``x-api-key``, on every route but liveness, version, metrics and
the API description; the request-body limit), the engine's life cycle and the app state. Every route — the OpenAI
API included — comes from an :class:`host.sdk.EndpointPlugin` in the ``host.endpoints``
registry. A plugin whose ``required_tasks`` the model does not support is skipped with an INFO
line; two plugins claiming the same method and path are a start-up error naming both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from host.core.entrypoints.drain import Drain, DrainMiddleware
from host.core.entrypoints.middleware import ApiKeyMiddleware, BodyLimitMiddleware, InternalErrorMiddleware
from host.core.entrypoints.server_settings import DEFAULT_MAX_REQUEST_BYTES, MODEL_TASKS, ServerSettings
from host.core.utils import freeze_startup_objects
from host.interfaces.errors import error_body

logger = logging.getLogger("host.api")

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "MODEL_TASKS", "ServerSettings", "build_app", "served_model_names", "tasks_of"]


def tasks_of(config: Any) -> tuple[str, ...]:
    """What the served model does, for ``ServerSettings.model_tasks``: ``("embed", "score")`` for
    a pooling model (``config.model.runner``), else ``("generate",)``."""
    return ("embed", "score") if getattr(config.model, "runner", "generate") == "pooling" else MODEL_TASKS


def served_model_names(config: Any, settings: ServerSettings) -> list[str]:
    """The names requests may use, the listed one first: ``--served-model-name`` (repeated for
    aliases), else the engine config's ``served_model_name`` (the model as the user typed it, see
    :func:`host.core.models.default_model.served_name`), else the model folder's base name (a
    config built by hand) — never an absolute local path."""
    if settings.served_model_names:
        return list(dict.fromkeys(settings.served_model_names))
    if config.model.served_model_name:
        return [config.model.served_model_name]
    return [os.path.basename(str(config.model.model).rstrip("/")) or "default"]


def _error(status: int, message: str, type_: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, param, status), status_code=status)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    parts, param = [], None
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            detail = (err.get("ctx") or {}).get("error", "")
            return f"the request body is not valid JSON ({detail})" if detail else "the request body is not valid JSON", None
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        if loc and param is None:
            param = ".".join(loc)
        parts.append(f"{'.'.join(loc) or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request body", param


def select_endpoints(plugin_host: Any, model_tasks: tuple[str, ...]) -> list[Any]:
    """The endpoint plugins to attach, in registration order."""
    chosen, claimed = [], {}
    registry = plugin_host.registry("endpoints")
    for name, plugin in registry.items():
        needs = plugin.required_tasks
        if needs is not None and not set(needs) & set(model_tasks):
            logger.info(
                "endpoint plugin %r skipped: it needs a model with task(s) %s, this model supports %s",
                name, ", ".join(needs), ", ".join(model_tasks),
            )
            continue
        for route in plugin.routes():
            key = (route[0].upper(), route[1])
            if key in claimed:
                raise RuntimeError(
                    f"endpoint plugins {claimed[key]!r} and {name!r} both serve {key[0]} {key[1]}; "
                    "block one of them with --block-plugins"
                )
            claimed[key] = name
        chosen.append(plugin)
    return chosen


def build_app(config: Any, settings: ServerSettings, plugin_host: Any, engine: Any = None, start_engine: bool = True,
              early_engine: Any = None) -> FastAPI:
    """The app. With ``start_engine`` the engine process is started in the app's lifespan (so
    its sockets live on uvicorn's event loop) and stopped when the server stops; the engine runs
    in ``early_engine`` when given (a :func:`~host.core.engine.client.prestart_engine` process)."""
    from host.core.frontend.async_llm import AsyncLLM, EngineDeadError
    from host.interfaces.errors import APIError

    endpoints = select_endpoints(plugin_host, settings.model_tasks)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = app.state
        if start_engine and state.engine is None:
            state.engine = await AsyncLLM.start(config, early=early_engine)
        if state.engine is not None:
            state.stat_context.engine_info.update(state.engine.engine_info)
            state.engine.stat_loggers = state.stat_loggers
            state.engine.max_queued_requests = settings.max_queued_requests
            state.stat_loggers.start()
        state.drain.engine = state.engine
        watch = asyncio.create_task(_exit_on_engine_death(state)) if settings.exit_on_engine_death and state.engine is not None else None
        for plugin in endpoints:
            await plugin.init_state(state.engine, state, settings)
        freeze_startup_objects()  # a full collection would walk torch's objects on the event loop
        state.ready.set()
        try:
            yield
        finally:
            if watch is not None:
                watch.cancel()
            if state.engine is not None and start_engine:
                await state.engine.shutdown()
            state.stat_loggers.shutdown()

    docs: dict[str, Any] = {"docs_url": None, "redoc_url": None, "openapi_url": None} if settings.disable_fastapi_docs else {}
    app = FastAPI(title="host", version=_version(), lifespan=lifespan, **docs)
    state = app.state
    state.engine = engine
    state.config = config
    state.settings = settings
    state.served_model_names = served_model_names(config, settings)
    state.max_model_len = config.model.max_model_len
    state.model_path = config.model.model
    state.started_at = time.time()
    _attach_stat_loggers(state, config, settings, plugin_host)
    state.ready = asyncio.Event()
    state.drain = Drain(settings.shutdown_timeout)
    state.endpoints = [p.name for p in endpoints]

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(error_body(exc.message, exc.type, exc.param, exc.code), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return _error(400, message, "BadRequestError", param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        type_ = {404: "NotFoundError", 405: "MethodNotAllowedError", 401: "AuthenticationError"}.get(exc.status_code, "HTTPError")
        return _error(exc.status_code, str(exc.detail), type_)

    @app.exception_handler(ValueError)
    async def value_error(_: Request, exc: ValueError) -> JSONResponse:
        return _error(400, str(exc), "BadRequestError")

    @app.exception_handler(EngineDeadError)
    async def engine_dead(_: Request, exc: EngineDeadError) -> JSONResponse:
        return _error(503, f"the engine is not running: {exc}", "ServiceUnavailableError")

    # outermost last: the key is checked first, then the body's size, then what escaped every handler
    app.add_middleware(InternalErrorMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_bytes)
    if settings.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=settings.api_key)
    if settings.cors is not None:  # outside the key check: a browser's preflight carries no key
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, **settings.cors)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]

    for plugin in endpoints:
        plugin.attach_router(app)
    app.add_middleware(DrainMiddleware, drain=state.drain)  # outermost: refuses before any work
    return app


def _attach_stat_loggers(state: Any, config: Any, settings: ServerSettings, plugin_host: Any) -> None:
    """The stat loggers (``host.stat_loggers``) and the Prometheus registry ``/metrics`` renders
    (``state.metrics_registry``); a bad ``--stat-loggers`` entry fails here, before the engine
    starts."""
    from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

    from host.core.frontend.stat_loggers import StatLoggerManager
    from host.interfaces.stat_logger import StatLoggerContext

    state.metrics_registry = CollectorRegistry()
    for collector in (ProcessCollector, PlatformCollector, GCCollector):  # process_*, python_*, as vLLM shows
        collector(registry=state.metrics_registry)
    state.stat_context = StatLoggerContext(
        config=config, model_name=state.served_model_names[0], metrics_prefix=settings.metrics_prefix,
        registry=state.metrics_registry, log_interval=settings.log_stats_interval,
    )
    registry = dict(plugin_host.registry("stat_loggers").items())
    state.stat_loggers = StatLoggerManager.create(registry, state.stat_context, settings.stat_loggers, settings.disable_log_stats)


async def _exit_on_engine_death(state: Any) -> None:
    """Stop the server (exit code 1, for a supervisor to restart it) once the engine process
    is gone; the requests in flight have already failed with 503."""
    while state.engine.dead_reason is None and state.engine.is_healthy:
        await asyncio.sleep(0.2)
    logger.error("the engine process is gone (%s): the server exits (--exit-on-engine-death)", state.engine.dead_reason)
    state.drain.exit(1)


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema, saying what the server sends: a bad body is a 400 with the OpenAI error
    body (FastAPI would document a 422 with its own validation shape)."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        error_ref = {"$ref": "#/components/schemas/ErrorResponse"}
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                responses = operation.get("responses", {})
                if responses.pop("422", None) is not None:
                    responses["400"] = {"description": "Bad request", "content": {"application/json": {"schema": error_ref}}}
        schemas = schema.setdefault("components", {}).setdefault("schemas", {})
        schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)
        schemas["ErrorResponse"] = {
            "title": "ErrorResponse",
            "type": "object",
            "required": ["error"],
            "properties": {"error": {"type": "object", "required": ["message", "type"], "properties": {
                "message": {"type": "string"}, "type": {"type": "string"},
                "param": {"anyOf": [{"type": "string"}, {"type": "null"}]}, "code": {},
            }}},
        }
        app.openapi_schema = schema
    return app.openapi_schema


def _version() -> str:
    from host import __version__

    return __version__
