"""``POST /v1/messages`` (Anthropic's Messages API) and ``POST /v1/messages/count_tokens``, as an
endpoint plugin.

A Messages request is translated to the chat request it stands for (:mod:`.anthropic_protocol`)
and then runs on the chat route's machinery: the chat template (with the tools in the prompt as
the chat route puts them there), the tool parser of ``--tool-call-parser`` for ``tool_choice``
auto, the structured-output grammar for ``any`` and a named tool, the ``--reasoning-parser`` for
``thinking`` blocks, the same sampling parameters. The answer is Anthropic's ``Message``
(:mod:`.anthropic_output`) or its event stream (:mod:`.anthropic_stream`); errors carry
Anthropic's body (:mod:`.anthropic_errors`). ``count_tokens`` renders the prompt exactly as
``/v1/messages`` does and answers ``{"input_tokens": N}``, the ``usage.input_tokens`` the same
request gets.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from host.plugins.endpoints.anthropic_errors import AnthropicErrorBodies
from host.plugins.endpoints.anthropic_output import finished_message, message_id
from host.plugins.endpoints.anthropic_protocol import CountTokensRequest, MessagesRequest
from host.plugins.endpoints.anthropic_stream import message_events
from host.plugins.endpoints.chat import chat_parsing, constrain, render_chat
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
from host.plugins.endpoints.openai_common import generations, sampling_params
from host.sdk import APIError, EndpointPlugin


async def create_message(body: MessagesRequest, raw: Request) -> Any:
    engine = engine_of(raw)
    model = check_model(raw, body.model)
    chat = body.chat_request()
    check_counts(chat)
    parsing = chat_parsing(raw, chat)
    text, ids = await off_loop(render_chat, engine.tokenizer, chat, raw.app.state.settings, engine.check_prompt_length,
                               tokenizer_process(raw))
    params = sampling_params(chat, body.max_tokens, None, body.max_tokens)
    constrain(params, parsing)
    try:
        engine.validate(ids, params)
    except ValueError as exc:
        raise APIError(400, str(exc), param="messages") from None
    engine.admit()
    msg_id = message_id()
    (gen,) = generations(engine, chat, params, [(text, ids)], msg_id, None, lora_request_for(raw.app.state, model))
    if body.stream:
        events = message_events(gen, msg_id, model, len(ids), parsing, body.stop_sequences)
        return StreamingResponse(events, media_type="text/event-stream")
    result = await run_to_end(raw, gen)
    return FastJSONResponse(await off_loop(finished_message, result, msg_id, model, parsing, body.stop_sequences))


async def count_tokens(body: CountTokensRequest, raw: Request) -> Any:
    engine = engine_of(raw)
    check_model(raw, body.model)
    chat = body.chat_request()
    check_counts(chat)
    chat_parsing(raw, chat)  # the tool fields refused as /v1/messages refuses them
    _, ids = await off_loop(render_chat, engine.tokenizer, chat, raw.app.state.settings, None, tokenizer_process(raw))
    return FastJSONResponse({"input_tokens": len(ids)})


class MessagesEndpoint(EndpointPlugin):
    name = "anthropic_messages"
    required_tasks = ("generate",)

    def attach_router(self, app: Any) -> None:
        app.add_middleware(AnthropicErrorBodies)
        router = APIRouter()
        router.add_api_route("/v1/messages", create_message, methods=["POST"], summary="Create a message (Anthropic's Messages API)")
        router.add_api_route("/v1/messages/count_tokens", count_tokens, methods=["POST"],
                             summary="Count a message request's input tokens (Anthropic's Messages API)")
        app.include_router(router)

    def routes(self) -> list[tuple[str, str]]:
        return [("POST", "/v1/messages"), ("POST", "/v1/messages/count_tokens")]
