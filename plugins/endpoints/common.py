"""What the built-in routes share: the served-model check, the thread pool that keeps CPU work
off the event loop, tokenizing and JSON rendering that leave the GIL to the event loop, the
request-size caps, running a request to completion while watching for a
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

import msgspec
from fastapi import Request
from fastapi.responses import JSONResponse

from host.plugins.endpoints.tokenizer_process import TokenizerProcess, ids_from_bytes
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


def tokenizer_process(raw: Request) -> TokenizerProcess:
    """This server's :class:`TokenizerProcess` (its child starts at the first large text)."""
    state = raw.app.state
    process = getattr(state, "tokenizer_process", None)
    if process is None:
        config = getattr(state, "config", None)
        path = getattr(getattr(config, "model", None), "tokenizer", None)
        process = state.tokenizer_process = TokenizerProcess(path if isinstance(path, str) else None)
    return process


def encode_text(
    tokenizer: Any, text: str, add_special_tokens: bool = True, check: Callable[[int], None] | None = None,
    param: str = "prompt", process: TokenizerProcess | None = None,
) -> list[int]:
    """The token ids of ``text``, equal to ``tokenizer.encode(text, add_special_tokens=...)``.

    A large text goes to ``process`` (see :mod:`.tokenizer_process`). Otherwise a fast (Rust)
    tokenizer is called through ``encode_batch``, which releases the GIL while it works (its
    single-text ``encode`` holds it throughout). ``check(count)`` (the engine's length rule,
    raising ``ValueError``: a 400 naming ``param``) runs before the ids become Python ints.
    Blocks: run it in :func:`off_loop`."""
    if process is not None and process.handles(text):
        count, packed = process.encode(text, add_special_tokens)
        _check_count(check, count, param)
        return ids_from_bytes(packed)
    backend = getattr(tokenizer, "_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
    if backend is None or not hasattr(backend, "encode_batch"):
        ids = tokenizer.encode(text, add_special_tokens=add_special_tokens)
        _check_count(check, len(ids), param)
        return ids
    if backend.padding is not None or backend.truncation is not None:
        # a tokenizer.json's own padding / truncation (MiniLM's: fixed at 128) is off, as the
        # tokenizer's encode() turns it off
        backend.no_padding()
        backend.no_truncation()
    encoding = backend.encode_batch([text], add_special_tokens=add_special_tokens)[0]
    _check_count(check, len(encoding), param)
    return encoding.ids


def _check_count(check: Callable[[int], None] | None, count: int, param: str) -> None:
    if check is not None:
        try:
            check(count)
        except ValueError as exc:
            raise APIError(400, str(exc), param=param) from None


class FastJSONResponse(JSONResponse):
    """A JSON response rendered by msgspec: a body of millions of numbers (``/tokenize`` of a
    large text, whole-vocabulary logprobs) renders in ~10 ms where ``json.dumps`` holds the GIL
    for ~250 ms. Non-ASCII stays UTF-8; a non-finite float (a ``-inf`` logprob) becomes ``null``."""

    CHUNK_BYTES = 256 * 1024
    """A larger body is sent in pieces of this size: one write of 16 MB keeps the event loop
    inside ``send()`` for as long as the kernel takes to copy it."""

    def render(self, content: Any) -> bytes:
        return msgspec.json.encode(content)

    @classmethod
    def from_rendered(cls, body: bytes, status_code: int = 200) -> "FastJSONResponse":
        """A response of JSON bytes rendered elsewhere (sent in pieces like any other)."""
        response = cls(None, status_code=status_code)
        response.body = body
        response.init_headers()
        return response

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if len(self.body) <= self.CHUNK_BYTES:
            return await super().__call__(scope, receive, send)
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        body = memoryview(self.body)
        for start in range(0, len(body), self.CHUNK_BYTES):
            end = start + self.CHUNK_BYTES
            await send({"type": "http.response.body", "body": bytes(body[start:end]), "more_body": end < len(body)})
        if self.background is not None:
            await self.background()


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
    """The served model name a request addresses: a base model name or a LoRA adapter's
    (:mod:`.lora_registry`; 404 for an unknown one)."""
    names = raw.app.state.served_model_names
    if model is None or model == "":
        return names[0]
    if model not in names:
        registry = getattr(raw.app.state, "lora_registry", None)
        if registry is not None and registry.get(model) is not None:
            return model
        served = names + [a.lora_request.lora_name for a in (registry.adapters() if registry is not None else [])]
        raise APIError(404, f"The model `{model}` does not exist; this server serves {', '.join(served)}.", "NotFoundError", "model")
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
