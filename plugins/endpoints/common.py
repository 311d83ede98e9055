"""What the built-in routes share: the served-model check, the thread pool that keeps CPU work
off the event loop, the request-size caps, running a request to completion while watching for a
client that went away, and SSE framing. Errors are :class:`host.sdk.APIError`."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Callable, TypeVar

from fastapi import Request

from host.sdk import APIError

logger = logging.getLogger("host.api")

T = TypeVar("T")

# Caps on what a single request may carry where the work grows with the count (each is far above
# what a real client sends; the body limit, --max-request-bytes, bounds everything else).
MAX_MESSAGES = 10_000
"""Most chat messages in one request (``/v1/chat/completions``, ``/tokenize``)."""
MAX_STOP_STRINGS = 1_000
"""Most ``stop`` strings: each is searched for in the text after every step."""
MAX_BAD_WORDS = 1_000
"""Most ``bad_words``: each is tokenized twice and checked at every step."""

_POOL = ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2)), thread_name_prefix="host-api-work")


async def off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in the API process's worker pool (tokenizing, chat templating,
    detokenizing, building large response bodies), so the event loop keeps answering."""
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_POOL, call)


def check_counts(body: Any) -> None:
    """400 for a request over :data:`MAX_MESSAGES`, :data:`MAX_STOP_STRINGS` or
    :data:`MAX_BAD_WORDS`."""
    for field, cap in (("messages", MAX_MESSAGES), ("stop", MAX_STOP_STRINGS), ("bad_words", MAX_BAD_WORDS)):
        value = getattr(body, field, None)
        if isinstance(value, list) and len(value) > cap:
            raise APIError(400, f"{field} has {len(value)} entries; this server accepts at most {cap}", param=field)


class ClientDisconnected(APIError):
    """The client went away before a non-streaming answer was ready (its request is aborted).
    Status 499, as nginx logs it; nobody receives the body."""

    def __init__(self) -> None:
        super().__init__(499, "the client disconnected", "ClientDisconnected")


def engine_of(raw: Request) -> Any:
    engine = getattr(raw.app.state, "engine", None)
    if engine is None:
        raise APIError(503, "no engine is running behind this server", "ServiceUnavailableError")
    return engine


def check_model(raw: Request, model: str | None) -> str:
    """The served model name a request addresses (404 for an unknown one)."""
    names = raw.app.state.served_model_names
    if model is None or model == "":
        return names[0]
    if model not in names:
        raise APIError(404, f"The model `{model}` does not exist; this server serves {', '.join(names)}.", "NotFoundError", "model")
    return model


async def run_to_end(raw: Request, gen: AsyncIterator[Any]) -> Any:
    """Drain a ``generate`` iterator, cancelling it (which aborts the request and frees its
    blocks) if the HTTP client disconnects first."""

    async def drain() -> Any:
        last = None
        async for out in gen:
            last = out
        return last

    task = asyncio.ensure_future(drain())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.5)
            if done:
                return task.result()
            if await raw.is_disconnected():
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                await gen.aclose()
                logger.info("%s %s: the client disconnected; its request was aborted", raw.method, raw.url.path)
                raise ClientDisconnected()
    except asyncio.CancelledError:
        task.cancel()
        raise


def sse(payload: Any) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"
