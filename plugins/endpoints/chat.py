"""``POST /v1/chat/completions`` as an endpoint plugin.

The messages are rendered by the chat template (:mod:`.chat_template`), then generated like a
completion; streams (server-sent events) or answers in one JSON body, with ``n``, logprobs,
structured outputs and the vLLM sampling extensions. A client that disconnects aborts its request.
"""

from __future__ import annotations

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
from host.plugins.endpoints.openai_common import (
    ChoiceCursor,
    chat_logprobs,
    check_sequences,
    error_event,
    merged_stream,
    sampling_params,
    usage,
)
from host.plugins.endpoints.protocol import ChatCompletionRequest
from host.sdk import APIError, EndpointPlugin

logger = logging.getLogger("host.api")


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
    check_sequences(raw, 1, body.n)
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
    params = sampling_params(body, max_tokens, top if body.logprobs else None, default_max)
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
            "logprobs": chat_logprobs(comp, 0, len(comp.token_ids), top, tokenizer),
            "finish_reason": comp.finish_reason,
            "stop_reason": comp.stop_reason,
        }
        for comp in result.outputs
    ]
    return FastJSONResponse({
        "id": request_id, "object": "chat.completion", "created": created, "model": model,
        "choices": choices, "usage": usage([result]),
    })


async def _stream_chat(gen, request_id, created, model, top, include_usage, tokenizer) -> AsyncIterator[str]:
    cursors: dict[int, ChoiceCursor] = {}
    final = None
    base = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model}
    try:
        async for res in merged_stream([gen]):
            final = res[1]
            for comp in final.outputs:
                cur = cursors.setdefault(comp.index, ChoiceCursor())
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
                    "logprobs": chat_logprobs(comp, cur.tokens, len(comp.token_ids), top, tokenizer),
                    "finish_reason": comp.finish_reason if finished else None,
                    "stop_reason": comp.stop_reason if finished else None,
                }]}
                cur.text, cur.tokens, cur.done = len(comp.text), len(comp.token_ids), finished
                yield sse(chunk)
        if include_usage and final is not None:
            yield sse({**base, "choices": [], "usage": usage([final])})
    except Exception as exc:  # noqa: BLE001
        logger.warning("chat stream %s failed: %s", request_id, exc)
        yield error_event(exc)
    yield SSE_DONE


class ChatCompletionsEndpoint(EndpointPlugin):
    name = "openai_chat_completions"
    required_tasks = ("generate",)

    def attach_router(self, app: Any) -> None:
        router = APIRouter()
        router.add_api_route("/v1/chat/completions", create_chat_completion, methods=["POST"], summary="Create a chat completion")
        app.include_router(router)

    def routes(self) -> list[tuple[str, str]]:
        return [("POST", "/v1/chat/completions")]
