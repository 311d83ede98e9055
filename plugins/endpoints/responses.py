"""``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}``: OpenAI's Responses API as an
endpoint plugin, on the chat route's machinery.

A request becomes a chat request (:mod:`.responses_input`): the prompt is rendered by the chat
template, ``tool_choice`` "required" or named is enforced by the structured-output grammar, the
output is read by the server's tool and reasoning parsers, the sampling fields are chat's. The
output becomes Responses items and, streamed, the official event sequence
(:mod:`.responses_stream`), from ``response.created`` and ``response.in_progress`` to
``response.completed``, which carries the response and its ``status`` (``"incomplete"`` with
``incomplete_details.reason`` ``"max_output_tokens"`` when that limit cut it: as vLLM, no
separate ``response.incomplete`` event, which the official client's ``responses.stream`` helper
does not take as an end); an error mid-stream is an ``error`` event, then ``response.failed``.

``usage`` counts the prompt (``input_tokens``, with ``input_tokens_details``: ``cached_tokens``
the prefix cache served, ``cache_write_tokens`` the other prompt tokens in full KV blocks, which
this request computed and cached; 0 without prefix caching) and the output (``output_tokens``; ``output_tokens_details.reasoning_tokens``
up to the end of the reasoning, with a reasoning parser).

With ``store`` (the default) the finished response is kept in the server's
:class:`~.responses_store.ResponseStore`: ``GET`` reads it back, ``DELETE`` removes it, and a
request with ``previous_response_id`` continues its conversation (its items, then its output,
then the new ``input``; the previous ``instructions`` are not carried over, as on OpenAI's API).
An id the store does not hold is a 404 naming it.
"""

from __future__ import annotations

import logging
import time
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from host.plugins.endpoints.chat import chat_parsing, constrain, render_chat, resolve_parsers
from host.plugins.endpoints.chat_output import ChatParsing
from host.plugins.endpoints.common import (
    FastJSONResponse,
    check_counts,
    check_model,
    engine_of,
    off_loop,
    run_to_end,
    tokenizer_process,
)
from host.plugins.endpoints.lora_registry import lora_request_for
from host.plugins.endpoints.openai_common import generations, merged_stream, sampling_params
from host.plugins.endpoints.responses_input import chat_request, input_items
from host.plugins.endpoints.responses_protocol import ResponsesRequest
from host.plugins.endpoints.responses_store import ResponseStore
from host.plugins.endpoints.responses_stream import EventLog, OutputBuilder, new_id
from host.sdk import APIError, EndpointPlugin

logger = logging.getLogger("host.api")


def response_store(raw: Request) -> ResponseStore:
    return raw.app.state.responses_store


def _not_found(response_id: str, param: str) -> APIError:
    return APIError(
        404, f"Response with id '{response_id}' not found: it was never stored (store=false), or it was deleted, "
        "evicted (--responses-store-size) or expired (--responses-store-ttl)", "NotFoundError", param,
    )


def constraint_field(body: ResponsesRequest) -> str | None:
    """The field whose JSON schema the structured-output grammar enforces (named in the 400 of a
    schema the grammar cannot compile): ``text.format.schema``, or the tools of a required or
    named ``tool_choice``."""
    fmt = body.format
    if fmt is not None and fmt.type == "json_schema":
        return "text.format.schema"
    if body.tool_choice == "required" or isinstance(body.tool_choice, dict):
        return "tools"
    return None


def _engine_error(exc: ValueError, body: ResponsesRequest) -> APIError:
    """A request the engine refused, as a 400 naming the field where the message says which."""
    message = str(exc).strip()
    param = constraint_field(body) if message.startswith("structured_outputs.") else None
    return APIError(400, f"{param}: {message}" if param else message, param=param)


def reasoning_tokens(token_ids: list[int], end_ids: list[int] | None, reasoned: bool) -> int:
    """The output tokens of the reasoning: through the first ``end_ids`` sequence, or all of them
    when it never ended; 0 for an output without reasoning."""
    if not reasoned:
        return 0
    n = len(end_ids or ())
    if n:
        for i in range(len(token_ids) - n + 1):
            if list(token_ids[i:i + n]) == end_ids:
                return i + n
    return len(token_ids)


class ResponseJob:
    """One response being generated: what its object repeats of the request, and how its
    output is read and stored."""

    def __init__(self, body: ResponsesRequest, response_id: str, model: str, parsing: ChatParsing, params: Any,
                 conversation: list[dict[str, Any]], store: ResponseStore, cache_block: int | None) -> None:
        self.body = body
        self.id = response_id
        self.created = int(time.time())
        self.model = model
        self.parsing = parsing
        self.params = params
        self.conversation = conversation
        self.store = store
        self.stored = body.stores and store.enabled
        self.cache_block = cache_block  # the KV block size with prefix caching, else None

    def object(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None = None,
               incomplete: dict[str, Any] | None = None, error: dict[str, Any] | None = None) -> dict[str, Any]:
        """The response object (``object: "response"``)."""
        body = self.body
        fmt = body.format
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "completed_at": int(time.time()) if status in ("completed", "incomplete") else None,
            "error": error, "incomplete_details": incomplete, "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens, "max_tool_calls": body.max_tool_calls, "model": self.model,
            "output": output, "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id, "reasoning": body.reasoning, "store": self.stored,
            "temperature": self.params.temperature, "top_p": self.params.top_p,
            "text": {"format": fmt.echo() if fmt is not None else {"type": "text"}},
            "tool_choice": body.tool_choice if body.tool_choice is not None else "auto", "tools": body.tools or [],
            "truncation": "disabled", "usage": usage, "user": body.user, "metadata": body.metadata or {},
            "background": False,
        }

    def usage(self, result: Any, builder: OutputBuilder) -> dict[str, Any]:
        comp = result.outputs[0]
        reasoning = self.parsing.reasoning
        reasoned = any(item["type"] == "reasoning" for item in builder.items)
        prompt, output, cached = len(result.prompt_token_ids), len(comp.token_ids), result.num_cached_tokens
        written = max(0, prompt // self.cache_block * self.cache_block - cached) if self.cache_block else 0
        return {
            "input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens(
                comp.token_ids, reasoning.end_token_ids() if reasoning is not None and reasoned else None, reasoned,
            )},
            "total_tokens": prompt + output,
        }

    def finish(self, result: Any, builder: OutputBuilder) -> dict[str, Any]:
        """The finished response (its output closed in ``builder``)."""
        reason = result.outputs[0].finish_reason
        status = "completed" if reason in ("stop", None) else "incomplete"
        incomplete = {"reason": "max_output_tokens"} if reason == "length" else None
        output = builder.finish(status)
        return self.object(status, output, self.usage(result, builder), incomplete)

    def save(self, response: dict[str, Any]) -> None:
        """Keep a finished response when the request asked (on the event loop: the store is not locked)."""
        if self.stored:
            self.store.put(self.id, response, self.conversation)

    def complete(self, result: Any) -> dict[str, Any]:
        """The non-streaming answer (CPU work: run it in the worker pool)."""
        builder = OutputBuilder(self.parsing, EventLog())
        builder.feed(result.outputs[0].text, final=True)
        return self.finish(result, builder)

    async def events(self, gen: AsyncIterator[Any]) -> AsyncIterator[str]:
        """The streamed answer, as server-sent events."""
        log = EventLog()
        builder = OutputBuilder(self.parsing, log)
        log.emit("response.created", response=self.object("in_progress", []))
        log.emit("response.in_progress", response=self.object("in_progress", []))
        yield log.drain()
        final, seen, fed_final = None, -1, False
        try:
            async for _, final in merged_stream([gen]):
                comp = final.outputs[0]
                finished = comp.finish_reason is not None
                if len(comp.text) == seen and not finished:
                    continue
                builder.feed(comp.text, finished)
                seen, fed_final = len(comp.text), finished
                frames = log.drain()
                if frames:
                    yield frames
            if final is None:
                raise RuntimeError("the engine ended the request without output")
            if not fed_final:
                builder.feed(final.outputs[0].text, True)
            response = self.finish(final, builder)
            self.save(response)
            log.emit("response.completed", response=response)
        except Exception as exc:  # noqa: BLE001 - the stream has started: the error goes in-band
            logger.warning("responses stream %s failed: %s", self.id, exc)
            error = _engine_error(exc, self.body) if isinstance(exc, ValueError) else None
            message = error.message if error is not None else str(exc)
            log.emit("error", code="invalid_request_error" if error is not None else "server_error", message=message,
                     param=error.param if error is not None else None)
            log.emit("response.failed", response=self.object("failed", builder.items, error={"code": "server_error", "message": message}))
        yield log.drain()


async def create_response(body: ResponsesRequest, raw: Request) -> Any:
    refused = body.refused()
    if refused is not None:
        raise APIError(400, refused[1], param=refused[0])
    engine = engine_of(raw)
    model = check_model(raw, body.model)
    store = response_store(raw)
    conversation: list[dict[str, Any]] = []
    if body.previous_response_id is not None:
        previous = store.get(body.previous_response_id)
        if previous is None:
            raise _not_found(body.previous_response_id, "previous_response_id")
        conversation = previous.conversation()
    conversation = conversation + input_items(body.input)
    chat = chat_request(body, conversation, bool(body.stream))
    check_counts(chat)
    parsing = chat_parsing(raw, chat)
    if body.max_tool_calls is not None:
        parsing.max_calls = min(parsing.max_calls or body.max_tool_calls, body.max_tool_calls)
    state = raw.app.state
    text, ids = await off_loop(render_chat, engine.tokenizer, chat, state.settings, engine.check_prompt_length,
                               tokenizer_process(raw))
    room = state.max_model_len - len(ids)
    if body.max_output_tokens is not None and body.max_output_tokens > room:
        raise APIError(400, f"max_output_tokens={body.max_output_tokens} plus the prompt's {len(ids)} tokens exceeds "
                       f"max_model_len={state.max_model_len}; ask for at most {room} tokens", param="max_output_tokens")
    params = sampling_params(chat, chat.max_completion_tokens, None, max(1, room))
    constrain(params, parsing)
    try:
        engine.validate(ids, params)
    except ValueError as exc:
        raise APIError(400, str(exc), param="input") from None
    engine.admit()
    cache = state.config.cache
    job = ResponseJob(body, new_id("resp"), model, parsing, params, conversation, store,
                      cache.block_size if cache.enable_prefix_caching else None)
    (gen,) = generations(engine, chat, params, [(text, ids)], job.id, chat.deadline(), lora_request_for(state, model))
    if body.stream:
        return StreamingResponse(job.events(gen), media_type="text/event-stream")
    try:
        result = await run_to_end(raw, gen)
    except ValueError as exc:  # a grammar that does not compile is found when the request starts
        raise _engine_error(exc, body) from None
    response = await off_loop(job.complete, result)
    job.save(response)
    return FastJSONResponse(response)


async def retrieve_response(response_id: str, raw: Request) -> Any:
    if raw.query_params.get("stream", "false").lower() not in ("false", "0"):
        raise APIError(400, "stream=true on GET /v1/responses/{id} (replaying a stream) is not supported; "
                       "read the stored response without it", param="stream")
    entry = response_store(raw).get(response_id)
    if entry is None:
        raise _not_found(response_id, "response_id")
    return FastJSONResponse(entry.response)


async def delete_response(response_id: str, raw: Request) -> Any:
    if not response_store(raw).delete(response_id):
        raise _not_found(response_id, "response_id")
    return FastJSONResponse({"id": response_id, "object": "response", "deleted": True})


class ResponsesEndpoint(EndpointPlugin):
    name = "openai_responses"
    required_tasks = ("generate",)

    def attach_router(self, app: Any) -> None:
        state = app.state
        settings = state.settings
        if getattr(state, "tool_parser_cls", None) is None and getattr(state, "reasoning_parser_cls", None) is None:
            state.tool_parser_cls, state.reasoning_parser_cls = resolve_parsers(settings)
        state.responses_store = ResponseStore(settings.responses_store_size, settings.responses_store_ttl)
        router = APIRouter()
        router.add_api_route("/v1/responses", create_response, methods=["POST"], summary="Create a model response")
        router.add_api_route("/v1/responses/{response_id}", retrieve_response, methods=["GET"], summary="Read a stored response")
        router.add_api_route("/v1/responses/{response_id}", delete_response, methods=["DELETE"], summary="Delete a stored response")
        app.include_router(router)

    def routes(self) -> list[tuple[str, str]]:
        return [("POST", "/v1/responses"), ("GET", "/v1/responses/{response_id}"), ("DELETE", "/v1/responses/{response_id}")]
