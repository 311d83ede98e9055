"""What the OpenAI routes share (``/v1/completions`` in :mod:`.completions`, ``/v1/chat/completions``
in :mod:`.chat`): usage counts, logprob formatting, the sampling-parameter translation, the
sequence cap, running several generations to the end or merging their streams, and the in-band
error event of a stream that already started."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator

from fastapi import Request

from host.plugins.endpoints.common import sse
from host.sdk import APIError

logger = logging.getLogger("host.api")


def merge_choices(results: list[Any], n: int) -> list[tuple[int, Any]]:
    """``(choice index, CompletionOutput)`` over prompts, ``n`` choices each."""
    return [(p * n + c.index, c) for p, res in enumerate(results) for c in res.outputs]


def usage(results: list[Any]) -> dict[str, int]:
    prompt = sum(len(r.prompt_token_ids) for r in results)
    completion = sum(len(c.token_ids) for r in results for c in r.outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def token_str(lp: Any, tok: int, tokenizer: Any) -> str:
    if lp is not None and lp.decoded_token is not None:
        return lp.decoded_token
    return tokenizer.decode([tok]) if tokenizer is not None else str(tok)


def completion_logprobs(comp: Any, start: int, end: int, text_offset: int, tokenizer: Any) -> dict[str, Any] | None:
    if comp.logprobs is None:
        return None
    tokens, values, tops, offsets = [], [], [], []
    offset = text_offset
    for tok, pos in zip(comp.token_ids[start:end], comp.logprobs[start:end]):
        text = token_str(pos.get(tok), tok, tokenizer)
        tokens.append(text)
        values.append(pos[tok].logprob)
        tops.append({token_str(lp, t, tokenizer): lp.logprob for t, lp in pos.items()})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(comp: Any, start: int, end: int, top: int, tokenizer: Any) -> dict[str, Any] | None:
    if comp.logprobs is None:
        return None
    content = []
    for tok, pos in zip(comp.token_ids[start:end], comp.logprobs[start:end]):
        text = token_str(pos.get(tok), tok, tokenizer)
        ranked = sorted(pos.items(), key=lambda kv: -kv[1].logprob)
        ranked = ranked if top < 0 else ranked[:top]  # -1 (allowed by --max-logprobs -1): all
        content.append({
            "token": text,
            "logprob": pos[tok].logprob,
            "bytes": list(text.encode()),
            "top_logprobs": [
                {"token": token_str(lp, t, tokenizer), "logprob": lp.logprob, "bytes": list(token_str(lp, t, tokenizer).encode())}
                for t, lp in ranked
            ],
        })
    return {"content": content}


def prompt_logprobs_json(result: Any) -> list[Any] | None:
    """vLLM's shape: one entry per prompt token (``None`` for the first), each
    ``{token_id: {"logprob", "rank", "decoded_token"}}`` with string keys (JSON)."""
    if result.prompt_logprobs is None:
        return None
    return [
        None if pos is None else {str(t): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": lp.decoded_token} for t, lp in pos.items()}
        for pos in result.prompt_logprobs
    ]


def sampling_params(body: Any, max_tokens: int | None, logprobs: int | None, default_max: int) -> Any:
    try:
        return body.sampling_params(max_tokens, logprobs, default_max)
    except (ValueError, TypeError) as exc:
        raise APIError(400, str(exc)) from None


def check_sequences(raw: Request, prompts: int, n: Any) -> None:
    """At most ``--max-sequences-per-request`` sequences (prompts x ``n``) per request, checked
    before any prompt is tokenized."""
    limit = getattr(raw.app.state.settings, "max_sequences_per_request", 256)
    if isinstance(n, int) and prompts * n > limit:
        raise APIError(
            400,
            f"this request asks for {prompts} prompt(s) x n={n} = {prompts * n} sequences; this server allows at most "
            f"{limit} per request (--max-sequences-per-request): send fewer prompts or a smaller n",
            param="n",
        )


async def gather_all_or_cancel(awaitables: list[Any]) -> list[Any]:
    """Every result in order; on the first failure the others are cancelled (which aborts
    their requests in the engine) before the error propagates, so nothing runs on unasked."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return await asyncio.gather(*tasks)
    finally:
        await cancel_pending(tasks)


async def cancel_pending(tasks: list[asyncio.Future]) -> None:
    """Cancel the tasks not done yet and wait until they have ended (each cancelled task closes
    its generator, which aborts its request in the engine)."""
    pending = [t for t in tasks if not t.done()]
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.wait(pending)


class ChoiceCursor:
    """Streaming cursor of one choice: what was already sent."""

    def __init__(self) -> None:
        self.text = 0
        self.tokens = 0
        self.done = False
        self.started = False


async def merged_stream(gens: list[AsyncIterator[Any]]) -> AsyncIterator[tuple[int, Any]]:
    """Snapshots of several prompts' generations as they arrive: ``(prompt index, output)``."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, gen: AsyncIterator[Any]) -> None:
        try:
            async for out in gen:
                await queue.put((i, out))
        except BaseException as exc:  # noqa: BLE001 - surfaced to the consumer
            await queue.put((i, exc))
        finally:
            await queue.put((i, None))

    tasks = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(gens)]
    remaining = len(gens)
    try:
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
                continue
            if isinstance(item, BaseException):
                raise item
            yield i, item
    finally:
        # each pump owns its generator: cancelling the pump closes it (aborting its request).
        # Closing a generator from here while its pump is suspended inside it would raise
        # "aclose(): asynchronous generator is already running".
        await cancel_pending(tasks)


def error_event(exc: BaseException) -> str:
    status = 503 if type(exc).__name__ == "EngineDeadError" else 400
    return sse({"error": {"message": str(exc), "type": type(exc).__name__, "param": None, "code": status}})
