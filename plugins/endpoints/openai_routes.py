"""``POST /v1/completions`` and ``POST /v1/chat/completions`` as endpoint plugins.

Both stream (server-sent events, ending with ``data: [DONE]``, an extra usage chunk with
``stream_options.include_usage``) or answer in one JSON body; both take ``n``, logprobs,
structured outputs (``response_format`` or ``structured_outputs``) and the vLLM sampling
extensions. A client that disconnects aborts its request, which frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from host.plugins.endpoints.chat_template import apply_template
from host.plugins.endpoints.common import (
    SSE_DONE,
    FastJSONResponse,
    check_counts,
    check_model,
    encode_text,
    engine_of,
    off_loop,
    run_to_end,
    sse,
    tokenizer_process,
)
from host.plugins.endpoints.protocol import ChatCompletionRequest, CompletionRequest
from host.sdk import APIError, EndpointPlugin

logger = logging.getLogger("host.api")


# -- shared ------------------------------------------------------------------------------------


def _merge(results: list[Any], n: int) -> list[tuple[int, Any]]:
    """``(choice index, CompletionOutput)`` over prompts, ``n`` choices each."""
    return [(p * n + c.index, c) for p, res in enumerate(results) for c in res.outputs]


def _usage(results: list[Any]) -> dict[str, int]:
    prompt = sum(len(r.prompt_token_ids) for r in results)
    completion = sum(len(c.token_ids) for r in results for c in r.outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _token_str(lp: Any, tok: int, tokenizer: Any) -> str:
    if lp is not None and lp.decoded_token is not None:
        return lp.decoded_token
    return tokenizer.decode([tok]) if tokenizer is not None else str(tok)


def _completion_logprobs(comp: Any, start: int, end: int, text_offset: int, tokenizer: Any) -> dict[str, Any] | None:
    if comp.logprobs is None:
        return None
    tokens, values, tops, offsets = [], [], [], []
    offset = text_offset
    for tok, pos in zip(comp.token_ids[start:end], comp.logprobs[start:end]):
        text = _token_str(pos.get(tok), tok, tokenizer)
        tokens.append(text)
        values.append(pos[tok].logprob)
        tops.append({_token_str(lp, t, tokenizer): lp.logprob for t, lp in pos.items()})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def _chat_logprobs(comp: Any, start: int, end: int, top: int, tokenizer: Any) -> dict[str, Any] | None:
    if comp.logprobs is None:
        return None
    content = []
    for tok, pos in zip(comp.token_ids[start:end], comp.logprobs[start:end]):
        text = _token_str(pos.get(tok), tok, tokenizer)
        ranked = sorted(pos.items(), key=lambda kv: -kv[1].logprob)
        ranked = ranked if top < 0 else ranked[:top]  # -1 (allowed by --max-logprobs -1): all
        content.append({
            "token": text,
            "logprob": pos[tok].logprob,
            "bytes": list(text.encode()),
            "top_logprobs": [
                {"token": _token_str(lp, t, tokenizer), "logprob": lp.logprob, "bytes": list(_token_str(lp, t, tokenizer).encode())}
                for t, lp in ranked
            ],
        })
    return {"content": content}


def _prompt_logprobs(result: Any) -> list[Any] | None:
    """vLLM's shape: one entry per prompt token (``None`` for the first), each
    ``{token_id: {"logprob", "rank", "decoded_token"}}`` with string keys (JSON)."""
    if result.prompt_logprobs is None:
        return None
    return [
        None if pos is None else {str(t): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": lp.decoded_token} for t, lp in pos.items()}
        for pos in result.prompt_logprobs
    ]


def _params(body: Any, max_tokens: int | None, logprobs: int | None, default_max: int) -> Any:
    try:
        return body.sampling_params(max_tokens, logprobs, default_max)
    except (ValueError, TypeError) as exc:
        raise APIError(400, str(exc)) from None


def _check_sequences(raw: Request, prompts: int, n: Any) -> None:
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


async def _gather_all_or_cancel(awaitables: list[Any]) -> list[Any]:
    """Every result in order; on the first failure the others are cancelled (which aborts
    their requests in the engine) before the error propagates, so nothing runs on unasked."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return await asyncio.gather(*tasks)
    finally:
        pending = [t for t in tasks if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending)


class _Choice:
    """Streaming cursor of one choice: what was already sent."""

    def __init__(self) -> None:
        self.text = 0
        self.tokens = 0
        self.done = False
        self.started = False


# -- completions -------------------------------------------------------------------------------


def _completion_prompts(prompt: Any, tokenizer: Any, check: Any, process: Any) -> list[tuple[str | None, list[int]]]:
    if isinstance(prompt, str):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise APIError(400, "prompt must be a non-empty string, list of strings, or token ids", param="prompt")
    if all(isinstance(t, int) for t in prompt):
        return [(None, list(prompt))]
    out: list[tuple[str | None, list[int]]] = []
    for p in prompt:
        if isinstance(p, str):
            out.append((p, encode_text(tokenizer, p, check=check, process=process)))
        elif isinstance(p, list) and p and all(isinstance(t, int) for t in p):
            out.append((None, list(p)))
        else:
            raise APIError(400, "prompt must be a non-empty string, list of strings, or token ids", param="prompt")
    return out


async def create_completion(body: CompletionRequest, raw: Request) -> Any:
    engine = engine_of(raw)
    model = check_model(raw, body.model)
    if body.suffix is not None:
        raise APIError(400, "suffix is not supported", param="suffix")
    if body.echo:
        raise APIError(400, "echo is not supported", param="echo")
    check_counts(body)
    tokenizer = engine.tokenizer
    flat = isinstance(body.prompt, str) or all(isinstance(t, int) for t in body.prompt)
    _check_sequences(raw, 1 if flat else len(body.prompt), body.n)
    prompts = await off_loop(_completion_prompts, body.prompt, tokenizer, engine.check_prompt_length, tokenizer_process(raw))
    params = _params(body, body.max_tokens, body.logprobs, 16)
    for _, ids in prompts:
        try:
            engine.validate(ids, params)
        except ValueError as exc:
            raise APIError(400, str(exc), param="prompt") from None
    engine.admit()
    request_id = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    deadline = body.deadline()
    gens = [
        engine.generate(ids, params, f"{request_id}-{i}", prompt=text, priority=body.priority, deadline=deadline)
        for i, (text, ids) in enumerate(prompts)
    ]
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(
            _stream_completion(gens, request_id, created, model, params.n, include_usage, tokenizer),
            media_type="text/event-stream",
        )
    results = await _gather_all_or_cancel([run_to_end(raw, g) for g in gens])
    return await off_loop(_completion_response, results, params, request_id, created, model, tokenizer)


def _completion_response(results: list[Any], params: Any, request_id: str, created: int, model: str, tokenizer: Any) -> FastJSONResponse:
    """The non-streaming body, logprobs included, serialised (in the worker pool)."""
    choices = []
    for index, comp in sorted(_merge(results, params.n), key=lambda x: x[0]):
        choice = {
            "index": index,
            "text": comp.text,
            "logprobs": _completion_logprobs(comp, 0, len(comp.token_ids), 0, tokenizer),
            "finish_reason": comp.finish_reason,
            "stop_reason": comp.stop_reason,
        }
        if params.prompt_logprobs is not None:
            choice["prompt_logprobs"] = _prompt_logprobs(results[index // params.n])
        choices.append(choice)
    return FastJSONResponse({
        "id": request_id, "object": "text_completion", "created": created, "model": model,
        "choices": choices, "usage": _usage(results),
    })


async def _merged_stream(gens: list[AsyncIterator[Any]]) -> AsyncIterator[tuple[int, Any]]:
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
        pending = [t for t in tasks if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending)


def _error_event(exc: BaseException) -> str:
    status = 503 if type(exc).__name__ == "EngineDeadError" else 400
    return sse({"error": {"message": str(exc), "type": type(exc).__name__, "param": None, "code": status}})


async def _stream_completion(gens, request_id, created, model, n, include_usage, tokenizer) -> AsyncIterator[str]:
    cursors: dict[int, _Choice] = {}
    finals: dict[int, Any] = {}
    try:
        async for p, res in _merged_stream(gens):
            finals[p] = res
            for comp in res.outputs:
                index = p * n + comp.index
                cur = cursors.setdefault(index, _Choice())
                if cur.done:
                    continue
                delta = comp.text[cur.text:]
                new_tokens = len(comp.token_ids) - cur.tokens
                finished = comp.finish_reason is not None
                if not delta and not finished and new_tokens == 0:
                    continue
                chunk = {
                    "id": request_id, "object": "text_completion", "created": created, "model": model,
                    "choices": [{
                        "index": index, "text": delta,
                        "logprobs": _completion_logprobs(comp, cur.tokens, len(comp.token_ids), cur.text, tokenizer),
                        "finish_reason": comp.finish_reason if finished else None,
                        "stop_reason": comp.stop_reason if finished else None,
                    }],
                }
                cur.text, cur.tokens, cur.done = len(comp.text), len(comp.token_ids), finished
                yield sse(chunk)
        if include_usage:
            yield sse({"id": request_id, "object": "text_completion", "created": created, "model": model,
                       "choices": [], "usage": _usage([finals[k] for k in sorted(finals)])})
    except Exception as exc:  # noqa: BLE001 - the stream already started: report in-band
        logger.warning("completion stream %s failed: %s", request_id, exc)
        yield _error_event(exc)
    yield SSE_DONE


# -- chat --------------------------------------------------------------------------------------


def _text_content(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(400, "only text content parts are supported", param="messages")
            parts.append(part["text"])
        return "".join(parts)
    raise APIError(400, "message content must be a string or a list of text parts", param="messages")


def normalize_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: text parts joined, ``None`` content as ``""``.
    Tool-call ``arguments`` given as a JSON string
    become a dict; malformed ones become ``{}`` with a warning — the bad value stays in the
    conversation's history, so failing the request would break every later turn."""
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise APIError(400, f"messages[{i}] must be an object with a string role", param="messages")
        m = dict(msg)
        # None (an assistant turn that only calls tools) becomes "": templates concatenate it
        m["content"] = _text_content(m.get("content")) or ""
        calls = m.get("tool_calls")
        if isinstance(calls, list):
            fixed = []
            for call in calls:
                call = dict(call) if isinstance(call, dict) else {}
                fn = dict(call.get("function") or {})
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        parsed = json.loads(args)
                        fn["arguments"] = parsed if isinstance(parsed, dict) else {}
                    except json.JSONDecodeError:
                        logger.warning("messages[%d]: malformed tool-call arguments %r replaced by {}", i, args[:80])
                        fn["arguments"] = {}
                elif not isinstance(args, dict):
                    fn["arguments"] = {}
                call["function"] = fn
                fixed.append(call)
            m["tool_calls"] = fixed
        out.append(m)
    return out


def render_chat(
    tokenizer: Any, body: ChatCompletionRequest, settings: Any, check: Any = None, process: Any = None,
) -> tuple[str, list[int]]:
    """The prompt text and ids of a chat request (CPU work: run it in the worker pool). A
    template the request brought is refused or bounded as :mod:`.chat_template` describes."""
    if not body.messages:
        raise APIError(400, "messages must not be empty", param="messages")
    text = apply_template(
        tokenizer,
        normalize_messages(body.messages),
        kwargs=dict(body.chat_template_kwargs or {}),
        trusted=settings.trust_request_chat_template,
        max_request_bytes=settings.max_request_bytes,
        tools=body.tools,
        add_generation_prompt=body.add_generation_prompt and not body.continue_final_message,
        continue_final_message=body.continue_final_message,
    )
    return text, encode_text(tokenizer, text, add_special_tokens=False, check=check, param="messages", process=process)


async def create_chat_completion(body: ChatCompletionRequest, raw: Request) -> Any:
    engine = engine_of(raw)
    model = check_model(raw, body.model)
    _check_sequences(raw, 1, body.n)
    check_counts(body)
    tokenizer = engine.tokenizer
    text, ids = await off_loop(
        render_chat, tokenizer, body, raw.app.state.settings, engine.check_prompt_length, tokenizer_process(raw),
    )
    top = body.top_logprobs or 0
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs requires logprobs=true", param="top_logprobs")
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    default_max = max(1, raw.app.state.max_model_len - len(ids))
    params = _params(body, max_tokens, top if body.logprobs else None, default_max)
    try:
        engine.validate(ids, params)
    except ValueError as exc:
        raise APIError(400, str(exc), param="messages") from None
    engine.admit()
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    gen = engine.generate(ids, params, request_id, prompt=text, priority=body.priority, deadline=body.deadline())
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(_stream_chat(gen, request_id, created, model, top, include_usage, tokenizer), media_type="text/event-stream")
    result = await run_to_end(raw, gen)
    return await off_loop(_chat_response, result, request_id, created, model, top, tokenizer)


def _chat_response(result: Any, request_id: str, created: int, model: str, top: int, tokenizer: Any) -> FastJSONResponse:
    """The non-streaming body, logprobs included, serialised (in the worker pool)."""
    choices = [
        {
            "index": comp.index,
            "message": {"role": "assistant", "content": comp.text},
            "logprobs": _chat_logprobs(comp, 0, len(comp.token_ids), top, tokenizer),
            "finish_reason": comp.finish_reason,
            "stop_reason": comp.stop_reason,
        }
        for comp in result.outputs
    ]
    return FastJSONResponse({
        "id": request_id, "object": "chat.completion", "created": created, "model": model,
        "choices": choices, "usage": _usage([result]),
    })


async def _stream_chat(gen, request_id, created, model, top, include_usage, tokenizer) -> AsyncIterator[str]:
    cursors: dict[int, _Choice] = {}
    final = None
    base = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model}
    try:
        async for res in _merged_stream([gen]):
            final = res[1]
            for comp in final.outputs:
                cur = cursors.setdefault(comp.index, _Choice())
                if cur.done:
                    continue
                if not cur.started:
                    cur.started = True
                    yield sse({**base, "choices": [{"index": comp.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]})
                delta = comp.text[cur.text:]
                finished = comp.finish_reason is not None
                if not delta and not finished and len(comp.token_ids) == cur.tokens:
                    continue
                chunk = {**base, "choices": [{
                    "index": comp.index,
                    "delta": {"content": delta} if delta else {},
                    "logprobs": _chat_logprobs(comp, cur.tokens, len(comp.token_ids), top, tokenizer),
                    "finish_reason": comp.finish_reason if finished else None,
                    "stop_reason": comp.stop_reason if finished else None,
                }]}
                cur.text, cur.tokens, cur.done = len(comp.text), len(comp.token_ids), finished
                yield sse(chunk)
        if include_usage and final is not None:
            yield sse({**base, "choices": [], "usage": _usage([final])})
    except Exception as exc:  # noqa: BLE001
        logger.warning("chat stream %s failed: %s", request_id, exc)
        yield _error_event(exc)
    yield SSE_DONE


# -- the plugins -------------------------------------------------------------------------------


class CompletionsEndpoint(EndpointPlugin):
    name = "openai_completions"
    required_tasks = ("generate",)

    def attach_router(self, app: Any) -> None:
        router = APIRouter()
        router.add_api_route("/v1/completions", create_completion, methods=["POST"], summary="Create a completion")
        app.include_router(router)

    def routes(self) -> list[tuple[str, str]]:
        return [("POST", "/v1/completions")]


class ChatCompletionsEndpoint(EndpointPlugin):
    name = "openai_chat_completions"
    required_tasks = ("generate",)

    def attach_router(self, app: Any) -> None:
        router = APIRouter()
        router.add_api_route("/v1/chat/completions", create_chat_completion, methods=["POST"], summary="Create a chat completion")
        app.include_router(router)

    def routes(self) -> list[tuple[str, str]]:
        return [("POST", "/v1/chat/completions")]
