"""``POST /v1/completions`` as an endpoint plugin.

Streams (server-sent events, ending with ``data: [DONE]``, an extra usage chunk with
``stream_options.include_usage``) or answers in one JSON body; takes several prompts, ``n``,
logprobs, structured outputs and the vLLM sampling extensions. A client that disconnects aborts its
request, which frees its KV blocks.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

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
    check_sequences,
    completion_logprobs,
    error_event,
    gather_all_or_cancel,
    merge_choices,
    merged_stream,
    prompt_logprobs_json,
    sampling_params,
    usage,
)
from host.plugins.endpoints.protocol import CompletionRequest
from host.sdk import APIError, EndpointPlugin

logger = logging.getLogger("host.api")


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
    check_sequences(raw, 1 if flat else len(body.prompt), body.n)
    prompts = await off_loop(_completion_prompts, body.prompt, tokenizer, engine.check_prompt_length, tokenizer_process(raw))
    params = sampling_params(body, body.max_tokens, body.logprobs, 16)
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
    results = await gather_all_or_cancel([run_to_end(raw, g) for g in gens])
    return await off_loop(_completion_response, results, params, request_id, created, model, tokenizer)


def _completion_response(results: list[Any], params: Any, request_id: str, created: int, model: str, tokenizer: Any) -> FastJSONResponse:
    """The non-streaming body, logprobs included, serialised (in the worker pool)."""
    choices = []
    for index, comp in sorted(merge_choices(results, params.n), key=lambda x: x[0]):
        choice = {
            "index": index,
            "text": comp.text,
            "logprobs": completion_logprobs(comp, 0, len(comp.token_ids), 0, tokenizer),
            "finish_reason": comp.finish_reason,
            "stop_reason": comp.stop_reason,
        }
        if params.prompt_logprobs is not None:
            choice["prompt_logprobs"] = prompt_logprobs_json(results[index // params.n])
        choices.append(choice)
    return FastJSONResponse({
        "id": request_id, "object": "text_completion", "created": created, "model": model,
        "choices": choices, "usage": usage(results),
    })


async def _stream_completion(gens, request_id, created, model, n, include_usage, tokenizer) -> AsyncIterator[str]:
    cursors: dict[int, ChoiceCursor] = {}
    finals: dict[int, Any] = {}
    try:
        async for p, res in merged_stream(gens):
            finals[p] = res
            for comp in res.outputs:
                index = p * n + comp.index
                cur = cursors.setdefault(index, ChoiceCursor())
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
                        "logprobs": completion_logprobs(comp, cur.tokens, len(comp.token_ids), cur.text, tokenizer),
                        "finish_reason": comp.finish_reason if finished else None,
                        "stop_reason": comp.stop_reason if finished else None,
                    }],
                }
                cur.text, cur.tokens, cur.done = len(comp.text), len(comp.token_ids), finished
                yield sse(chunk)
        if include_usage:
            yield sse({"id": request_id, "object": "text_completion", "created": created, "model": model,
                       "choices": [], "usage": usage([finals[k] for k in sorted(finals)])})
    except Exception as exc:  # noqa: BLE001 - the stream already started: report in-band
        logger.warning("completion stream %s failed: %s", request_id, exc)
        yield error_event(exc)
    yield SSE_DONE


class CompletionsEndpoint(EndpointPlugin):
    name = "openai_completions"
    required_tasks = ("generate",)

    def attach_router(self, app: Any) -> None:
        router = APIRouter()
        router.add_api_route("/v1/completions", create_completion, methods=["POST"], summary="Create a completion")
        app.include_router(router)

    def routes(self) -> list[tuple[str, str]]:
        return [("POST", "/v1/completions")]
