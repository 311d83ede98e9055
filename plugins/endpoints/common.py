"""What the built-in routes share: the served-model check, running a request to completion while
watching for a client that went away, and SSE framing. Errors are :class:`host.sdk.APIError`."""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator

from fastapi import Request

from host.sdk import APIError


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
                raise asyncio.CancelledError("client disconnected")
    except asyncio.CancelledError:
        task.cancel()
        raise


def sse(payload: Any) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"
