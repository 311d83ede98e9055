"""``POST /v1/completions`` as an endpoint plugin.

Streams (server-sent events, ending with ``data: [DONE]``, an extra usage chunk with
``stream_options.include_usage``, usage on every chunk with ``continuous_usage_stats`` too) or
answers in one JSON body; takes several prompts, ``n``, logprobs, structured outputs and the vLLM
sampling extensions. A client that disconnects aborts its request, which frees its KV blocks.

``echo`` puts the prompt before each choice's text and, with ``logprobs``, the prompt tokens'
logprobs before the completion's (the first ``null``: nothing predicts it), offsets continuous;
``max_tokens: 0`` is allowed with ``echo`` and answers just the prompt and its logprobs (how
lm-evaluation-harness scores log-likelihoods). A stream sends the prompt in each choice's first
chunk. vLLM's response extensions: ``return_token_ids`` (``prompt_token_ids`` and ``token_ids``
per choice; in a stream, prompt ids in the first chunk), ``return_tokens_as_token_ids``, and
``prompt_logprobs`` (``null`` unless asked); ``truncate_prompt_tokens`` / ``truncation_side``
cut the prompt before it is checked against ``max_model_len``.
"""

from __future__ import annotations

import dataclasses
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
from host.plugins.endpoints.lora_registry import lora_request_for
from host.plugins.endpoints.openai_common import (
    COMPLETION_RESPONSE_NULLS,
    ChoiceCursor,
    ResponseShape,
    check_sequences,
    check_stream_options,
    error_event,
    gather_all_or_cancel,
    generations,
    logprobs_object,
    merge_choices,
    merged_stream,
    prompt_logprobs_json,
    prompt_truncation,
    sampling_params,
    usage,
)
from host.plugins.endpoints.protocol import CompletionRequest
from host.sdk import APIError, EndpointPlugin

logger = logging.getLogger("host.api")

NO_PROMPT = "Either prompt or prompt_embeds must be provided and non-empty."
"""vLLM's 400 for a completion without a prompt (clients and vLLM's tests match these words)."""
EMPTY_PROMPT = "the decoder prompt cannot be empty; send at least one token"
"""The 400 for an empty prompt in a list, vLLM's words (``input_processor`` says the same)."""


def _completion_prompts(
    prompt: Any, tokenizer: Any, check: Any, process: Any, truncate: Any,
) -> list[tuple[str | None, list[int]]]:
    """``(text or None, ids)`` per prompt; a truncated prompt's text is ``None`` (no longer what
    was sent). ``prompt`` is not empty (:func:`create_completion` checked); an empty entry of a
    list is a 400 in vLLM's words, "the decoder prompt cannot be empty"."""
    if isinstance(prompt, str):
        prompt = [prompt]
    if not isinstance(prompt, list):
        raise APIError(400, "prompt must be a non-empty string, list of strings, or token ids", param="prompt")
    if all(isinstance(t, int) for t in prompt):
        prompt = [prompt]
    out: list[tuple[str | None, list[int]]] = []
    for p in prompt:
        if p == "" or p == []:
            raise APIError(400, EMPTY_PROMPT, param="prompt")
        if isinstance(p, str):
            text: str | None = p
            ids = encode_text(tokenizer, p, check=check, process=process)
        elif isinstance(p, list) and p and all(isinstance(t, int) for t in p):
            text, ids = None, list(p)
        else:
            raise APIError(400, "prompt must be a non-empty string, list of strings, or token ids", param="prompt")
        kept = truncate(ids)
        out.append((text if len(kept) == len(ids) else None, kept))
    return out


class _Echo:
    """What ``echo`` puts before each choice: the prompt's text and, with ``logprobs``, its
    tokens' logprobs (the first one ``null``). ``only`` (``max_tokens=0``): the prompt is the
    whole answer; the one token the engine had to generate is not returned."""

    def __init__(self, body: CompletionRequest) -> None:
        self.on = body.echo
        self.only = body.echo and body.max_tokens == 0
        self.top = body.logprobs

    def text(self, result: Any, tokenizer: Any) -> str:
        if result.prompt is not None:
            return result.prompt
        return tokenizer.decode(result.prompt_token_ids) if tokenizer is not None else ""

    @staticmethod
    def finish(comp: Any) -> str | None:
        """An echo-only choice's finish reason: ``"length"`` (it asked for 0 tokens), or
        ``"abort"`` when the request was cut short (a timeout, a disconnect)."""
        return "abort" if comp.finish_reason == "abort" else "length"

    def entries(self, result: Any) -> list[tuple[int, Any]]:
        plp = result.prompt_logprobs or [None] * len(result.prompt_token_ids)
        return list(zip(result.prompt_token_ids, plp))


def _params(body: CompletionRequest, echo: _Echo) -> Any:
    """The request's SamplingParams: echo with ``logprobs`` needs the prompt's logprobs (at
    least ``logprobs`` wide); ``max_tokens=0`` (only with echo) runs one token."""
    if body.max_tokens == 0 and not body.echo:
        raise APIError(400, "max_tokens=0 is only allowed with echo=true (the prompt is then the whole answer); "
                       "ask for at least 1 token", param="max_tokens")
    params = sampling_params(body, 1 if echo.only else body.max_tokens, body.logprobs, 16)
    if body.echo and body.logprobs is not None:
        asked = body.prompt_logprobs
        if asked is None or (asked != -1 and (body.logprobs == -1 or asked < body.logprobs)):
            params = dataclasses.replace(params, prompt_logprobs=body.logprobs)
    return params


async def create_completion(body: CompletionRequest, raw: Request) -> Any:
    engine = engine_of(raw)
    model = check_model(raw, body.model)
    if body.suffix is not None:
        raise APIError(400, "suffix is not supported", param="suffix")
    if body.prompt_embeds is not None and body.prompt_embeds != []:
        raise APIError(400, "prompt_embeds is not supported: host takes prompts as text or token ids; send prompt", param="prompt_embeds")
    if body.prompt is None or body.prompt == "" or body.prompt == []:  # vLLM's words for no prompt
        raise APIError(400, f"{NO_PROMPT} (host takes prompts as text or token ids)", param="prompt")
    check_stream_options(body)
    check_counts(body)
    tokenizer = engine.tokenizer
    flat = isinstance(body.prompt, str) or all(isinstance(t, int) for t in body.prompt)
    check_sequences(raw, 1 if flat else len(body.prompt), body.n)
    echo = _Echo(body)
    params = _params(body, echo)
    truncate = prompt_truncation(body, raw.app.state.max_model_len)
    check = None if body.truncate_prompt_tokens is not None else engine.check_prompt_length
    prompts = await off_loop(_completion_prompts, body.prompt, tokenizer, check, tokenizer_process(raw), truncate)
    for _, ids in prompts:
        try:
            engine.validate(ids, params)
        except ValueError as exc:
            raise APIError(400, str(exc), param="prompt") from None
    engine.admit()
    request_id = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    deadline = body.deadline()
    gens = generations(engine, body, params, prompts, request_id, deadline, lora_request_for(raw.app.state, model))
    shape = _Shape(body, echo, raw.app.state.settings, tokenizer)
    if body.stream:
        return StreamingResponse(_stream_completion(gens, request_id, created, model, params.n, shape), media_type="text/event-stream")
    results = await gather_all_or_cancel([run_to_end(raw, g) for g in gens])
    return await off_loop(_completion_response, results, params, request_id, created, model, shape)


class _Shape(ResponseShape):
    """:class:`ResponseShape` plus the completions route's echo and ``logprobs`` width."""

    def __init__(self, body: CompletionRequest, echo: _Echo, settings: Any, tokenizer: Any) -> None:
        super().__init__(body, settings)
        self.echo_of = echo
        self.logprobs = body.logprobs
        self.tokenizer = tokenizer

    def usage(self, results: list[Any]) -> dict[str, Any]:
        return usage(results, self.details, 0 if self.echo_of.only else None)


def _completion_response(results: list[Any], params: Any, request_id: str, created: int, model: str, shape: _Shape) -> FastJSONResponse:
    """The non-streaming body, logprobs included, serialised (in the worker pool)."""
    choices = []
    tokenizer, echo = shape.tokenizer, shape.echo_of
    for index, comp in sorted(merge_choices(results, params.n), key=lambda x: x[0]):
        result = results[index // params.n]
        ids = [] if echo.only else comp.token_ids
        text = "" if echo.only else comp.text
        logprobs = None
        if shape.logprobs is not None:
            entries = [] if echo.only else list(zip(comp.token_ids, comp.logprobs or []))
            if echo.on:
                entries = echo.entries(result) + entries
            logprobs = logprobs_object(entries, shape.logprobs, 0, tokenizer, shape.as_ids)
        if echo.on:
            text = echo.text(result, tokenizer) + text
        choice = {
            "index": index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": echo.finish(comp) if echo.only else comp.finish_reason,
            "stop_reason": None if echo.only else comp.stop_reason,
            "prompt_logprobs": prompt_logprobs_json(result, shape.prompt_logprobs) if shape.prompt_logprobs is not None else None,
        }
        if shape.token_ids:
            choice["prompt_token_ids"] = result.prompt_token_ids
            choice["token_ids"] = list(ids)
        choices.append(choice)
    transfer = next((r.kv_transfer_params for r in results if r.kv_transfer_params is not None), None)
    return FastJSONResponse({
        "id": request_id, "object": "text_completion", "created": created, "model": model,
        "choices": choices, "usage": shape.usage(results), **COMPLETION_RESPONSE_NULLS,
        **({"kv_transfer_params": transfer} if transfer is not None else {}),
    })


async def _stream_completion(gens, request_id, created, model, n, shape: _Shape) -> AsyncIterator[str]:
    cursors: dict[int, ChoiceCursor] = {}
    finals: dict[int, Any] = {}
    tokenizer, echo = shape.tokenizer, shape.echo_of
    try:
        async for p, res in merged_stream(gens):
            finals[p] = res
            for comp in res.outputs:
                index = p * n + comp.index
                cur = cursors.setdefault(index, ChoiceCursor())
                if cur.done:
                    continue
                finished = comp.finish_reason is not None
                if echo.only:  # one chunk: the prompt, once the engine is done with it
                    if not finished:
                        continue
                    end_tokens, end_text = cur.tokens, cur.text
                    delta, finish, stop = "", echo.finish(comp), None
                else:
                    end_tokens, end_text = len(comp.token_ids), len(comp.text)
                    delta = comp.text[cur.text:]
                    if not delta and not finished and end_tokens == cur.tokens:
                        continue
                    finish, stop = (comp.finish_reason, comp.stop_reason) if finished else (None, None)
                logprobs = None
                if shape.logprobs is not None:
                    entries = list(zip(comp.token_ids[cur.tokens:end_tokens], (comp.logprobs or [])[cur.tokens:end_tokens]))
                    offset = cur.text
                    if echo.on and not cur.started:
                        entries = echo.entries(res) + entries
                    elif echo.on:
                        offset += cur.echo_len
                    logprobs = logprobs_object(entries, shape.logprobs, offset, tokenizer, shape.as_ids)
                choice: dict[str, Any] = {"index": index, "text": delta, "logprobs": logprobs, "finish_reason": finish, "stop_reason": stop}
                if shape.token_ids:
                    choice["token_ids"] = list(comp.token_ids[cur.tokens:end_tokens])
                    if not cur.started:
                        choice["prompt_token_ids"] = res.prompt_token_ids
                if echo.on and not cur.started:
                    prompt_text = echo.text(res, tokenizer)
                    choice["text"] = prompt_text + delta
                    cur.echo_len = len(prompt_text)
                chunk: dict[str, Any] = {"id": request_id, "object": "text_completion", "created": created, "model": model, "choices": [choice]}
                if shape.continuous_usage:
                    chunk["usage"] = usage([res], shape.details, 0 if echo.only else end_tokens)  # this choice's so far
                cur.text, cur.tokens, cur.done, cur.started = end_text, end_tokens, finished, True
                yield sse(chunk)
        if shape.include_usage:
            yield sse({"id": request_id, "object": "text_completion", "created": created, "model": model,
                       "choices": [], "usage": shape.usage([finals[k] for k in sorted(finals)])})
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
