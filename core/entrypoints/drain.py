"""Graceful drain of the API server (process 0): stop admitting, let in-flight requests end,
abort the rest, exit.

A drain starts on the first SIGTERM / SIGINT or a ``POST /drain``. From then on every request
but ``/health``, ``/version``, ``/metrics`` and ``/drain`` is refused with 503, a
``Retry-After`` header and an OpenAI-style body (``/health`` itself answers 503, so a load
balancer stops routing here). The requests already in flight run on for up to
``shutdown_timeout`` seconds; the ones still running then are aborted — a stream ends with a
last chunk whose ``finish_reason`` is ``"abort"`` and ``data: [DONE]``, a non-streaming
request answers with what it generated so far — and the server exits, stopping its engine
process. The same exit path serves ``--exit-on-engine-death`` (exit code 1).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Callable

from host.interfaces.errors import error_body

logger = logging.getLogger("host.api")

#: paths served while draining (and not counted as in flight)
OPEN_WHILE_DRAINING = frozenset({"/health", "/version", "/metrics", "/drain"})
RETRY_AFTER_S = 5
_ABORT_GRACE_S = 5.0  # after aborting: time for the aborted responses to be written


class Drain:
    """The drain state of one server: whether it drains, what is in flight, how it exits.

    ``on_exit(code)`` is set by whoever runs the server (``host serve`` stops uvicorn with it);
    ``engine`` is the :class:`~host.core.frontend.async_llm.AsyncLLM` whose requests are
    aborted when the timeout is reached."""

    def __init__(self, shutdown_timeout: float) -> None:
        self.shutdown_timeout = shutdown_timeout
        self.draining = False
        self.in_flight = 0
        self.exit_code = 0
        self.engine: Any = None
        self.on_exit: Callable[[int], None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task | None = None

    def start(self, reason: str) -> bool:
        """Begin draining (from the event loop's thread); ``False`` if a drain already runs."""
        if self.draining:
            return False
        self.draining = True
        self._task = asyncio.get_running_loop().create_task(self._run(reason))
        return True

    async def _run(self, reason: str) -> None:
        logger.warning(
            "draining (%s): refusing new requests; %d in flight get up to %.0f s to finish",
            reason, self.in_flight, self.shutdown_timeout,
        )
        try:
            await asyncio.wait_for(self._idle.wait(), self.shutdown_timeout)
        except asyncio.TimeoutError:
            aborted = await self.engine.abort_all() if self.engine is not None else 0
            logger.warning("shutdown timeout (%.0f s) reached: aborted %d request(s)", self.shutdown_timeout, aborted)
            try:
                await asyncio.wait_for(self._idle.wait(), _ABORT_GRACE_S)
            except asyncio.TimeoutError:
                logger.warning("%d response(s) still open after the abort; closing anyway", self.in_flight)
        self.exit(0)

    def exit(self, code: int) -> None:
        """Stop the server with exit code ``code`` (the first non-zero code wins)."""
        self.exit_code = self.exit_code or code
        if self.on_exit is not None:
            self.on_exit(self.exit_code)

    # -- request accounting (the middleware) ------------------------------------------------
    def enter(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()


class DrainMiddleware:
    """ASGI middleware: counts the requests in flight and refuses new ones while draining."""

    def __init__(self, app: Any, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_WHILE_DRAINING:
            await self.app(scope, receive, send)
            return
        if self.drain.draining:
            await _refuse(send)
            return
        self.drain.enter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.leave()


async def _refuse(send: Any) -> None:
    body = json.dumps(
        error_body("the server is shutting down and admits no new requests; retry on another replica or later",
                   "ServiceUnavailableError", None, 503)
    ).encode()
    await send({
        "type": "http.response.start",
        "status": 503,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(RETRY_AFTER_S).encode()),
            (b"connection", b"close"),
        ],
    })
    await send({"type": "http.response.body", "body": body})
