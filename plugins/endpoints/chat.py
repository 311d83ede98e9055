"""``POST /v1/chat/completions`` as an endpoint plugin.

The messages are rendered by the chat template (:mod:`.chat_template`), then generated like a
completion; streams (server-sent events) or answers in one JSON body, with ``n``, logprobs,
structured outputs and the vLLM sampling extensions. A client that disconnects aborts its request.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from host.plugins.endpoints.chat_output import ChatParsing
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
from host.plugins.endpoints.lora_registry import lora_request_for
from host.plugins.endpoints.openai_common import (
    CHAT_MESSAGE_NULLS,
    CHAT_RESPONSE_NULLS,
    ChoiceCursor,
    ResponseShape,
    chat_echo,
    chat_logprobs,
    check_sequences,
    check_stream_options,
    error_event,
    generations,
    merged_stream,
    prompt_logprobs_json,
    prompt_truncation,
    sampling_params,
    usage,
)
from host.plugins.endpoints.protocol import ChatCompletionRequest
from host.plugins.endpoints.tool_calls import ToolChoice, resolve_tool_choice
from host.plugins.endpoints.tool_prompt import template_renders_tools, with_tools_in_messages
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
    ``tool_calls`` that is not a list of objects is a 400 naming it. Tool-call ``arguments`` given as a JSON string
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
        if calls is not None and not isinstance(calls, list):
            raise APIError(400, f"messages[{i}].tool_calls must be a list of tool calls, not {type(calls).__name__}",
                           param=f"messages[{i}].tool_calls")
        if isinstance(calls, list):
            fixed = []
            for j, call in enumerate(calls):
                if not isinstance(call, dict):
                    raise APIError(400, f'messages[{i}].tool_calls[{j}] must be an object {{"id", "type": "function", '
                                   f'"function": {{"name", "arguments"}}}}', param=f"messages[{i}].tool_calls")
                call = dict(call)
                if not isinstance(call.get("function") or {}, dict):
                    raise APIError(400, f'messages[{i}].tool_calls[{j}].function must be an object {{"name", "arguments"}}',
                                   param=f"messages[{i}].tool_calls")
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
    text = render_chat_text(tokenizer, body, settings)
    return text, encode_text(tokenizer, text, add_special_tokens=False, check=check, param="messages", process=process)


def render_chat_text(tokenizer: Any, body: Any, settings: Any) -> str:
    """The prompt text of ``body``'s ``messages`` (a chat request, or ``/tokenize``'s): its
    ``tools``, ``chat_template_kwargs``, ``add_generation_prompt`` and ``continue_final_message``,
    with the server's ``--chat-template``. CPU work: run it in the worker pool."""
    if not body.messages:
        raise APIError(400, "messages must not be empty", param="messages")
    messages, kwargs = normalize_messages(body.messages), dict(body.chat_template_kwargs or {})
    if not template_renders_tools(tokenizer, kwargs, getattr(settings, "chat_template", None)):
        messages = with_tools_in_messages(messages, body.tools)
    return apply_template(
        tokenizer,
        messages,
        kwargs=kwargs,
        trusted=settings.trust_request_chat_template,
        max_request_bytes=settings.max_request_bytes,
        template=getattr(settings, "chat_template", None),  # --chat-template
        tools=body.tools,
        add_generation_prompt=body.add_generation_prompt and not body.continue_final_message,
        continue_final_message=body.continue_final_message,
    )


async def create_chat_completion(body: ChatCompletionRequest, raw: Request) -> Any:
    engine = engine_of(raw)
    model = check_model(raw, body.model)
    check_sequences(raw, 1, body.n)
    check_counts(body)
    check_stream_options(body)
    parsing = chat_parsing(raw, body)
    tokenizer = engine.tokenizer
    truncate = prompt_truncation(body, raw.app.state.max_model_len)
    check = None if body.truncate_prompt_tokens is not None else engine.check_prompt_length
    text, ids = await off_loop(render_chat, tokenizer, body, raw.app.state.settings, check, tokenizer_process(raw))
    kept = truncate(ids)
    text, ids = (text if len(kept) == len(ids) else None), kept
    shape = ResponseShape(body, raw.app.state.settings)
    shape.echo = chat_echo(body)
    top = body.top_logprobs or 0
    if body.top_logprobs not in (None, 0) and not body.logprobs:  # 0 without logprobs passes, as on vLLM
        raise APIError(400, "top_logprobs requires logprobs=true", param="top_logprobs")
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    default_max = max(1, raw.app.state.max_model_len - len(ids))
    params = sampling_params(body, max_tokens, top if body.logprobs else None, default_max)
    constrain(params, parsing)
    try:
        engine.validate(ids, params)
    except ValueError as exc:
        raise APIError(400, str(exc), param="messages") from None
    engine.admit()
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    (gen,) = generations(engine, body, params, [(text, ids)], request_id, body.deadline(), lora_request_for(raw.app.state, model))
    if body.stream:
        return StreamingResponse(_stream_chat(gen, request_id, created, model, top, tokenizer, shape, parsing), media_type="text/event-stream")
    result = await run_to_end(raw, gen)
    return await off_loop(_chat_response, result, request_id, created, model, top, tokenizer, shape, parsing)


def resolve_parsers(settings: Any) -> tuple[Any, Any]:
    """The tool-parser and reasoning-parser classes the server's flags name (``None`` when
    unset), checked at start-up: an unknown name is a ``ValueError`` listing the known ones."""
    from host.sdk.runtime import get_plugin_host

    plugin_host = get_plugin_host()
    chosen = []
    for kind, flag, name in (
        ("tool_parsers", "--tool-call-parser", getattr(settings, "tool_call_parser", None)),
        ("reasoning_parsers", "--reasoning-parser", getattr(settings, "reasoning_parser", None)),
    ):
        registry = plugin_host.registry(kind)
        if name is not None and name not in registry:
            raise ValueError(
                f"{flag} {name!r} is not a known parser; known: {', '.join(sorted(registry)) or 'none'} "
                f"(plugins add more under the host.{kind} entry-point group)"
            )
        chosen.append(registry[name] if name is not None else None)
    if getattr(settings, "enable_auto_tool_choice", False) and chosen[0] is None:
        raise ValueError("--enable-auto-tool-choice requires --tool-call-parser NAME (the model's tool-call format, e.g. hermes)")
    return chosen[0], chosen[1]


def chat_parsing(raw: Request, body: ChatCompletionRequest) -> ChatParsing:
    """How this request's output is read; a 400 for inconsistent tool fields. The parsers are
    created once per server, with the engine's tokenizer."""
    state = raw.app.state
    parsers = getattr(state, "chat_parsers", None)
    if parsers is None:
        tokenizer = engine_of(raw).tokenizer
        tool_cls, reasoning_cls = getattr(state, "tool_parser_cls", None), getattr(state, "reasoning_parser_cls", None)
        parsers = state.chat_parsers = (
            tool_cls(tokenizer) if tool_cls is not None else None,
            reasoning_cls(tokenizer) if reasoning_cls is not None else None,
        )
    choice: ToolChoice = resolve_tool_choice(body, state.settings, parsers[0] is not None)
    return ChatParsing(choice, parsers[0], parsers[1], body.include_reasoning)


def constrain(params: Any, parsing: ChatParsing) -> None:
    """``tool_choice`` "required" or named as a JSON-schema constraint; with a reasoning parser,
    any constraint applies only after the reasoning's end tokens; a parser whose markers are
    special tokens keeps them in the text."""
    from host.sdk.sampling_params import StructuredOutputsParams

    if parsing.choice.schema is not None:
        params.structured_outputs = StructuredOutputsParams(json=parsing.choice.schema)
    if parsing.reasoning is not None and params.structured_outputs is not None:
        params.structured_outputs = dataclasses.replace(
            params.structured_outputs, reasoning_end_token_ids=parsing.reasoning.end_token_ids()
        )
    if parsing.choice.mode == "auto" and parsing.tool_parser is not None and parsing.tool_parser.keep_special_tokens:
        params.skip_special_tokens = False


def _message(comp: Any, shape: Any, parsing: ChatParsing) -> tuple[dict[str, Any], str | None]:
    """A choice's message (reasoning and tool calls parsed out) and its finish reason
    (``"tool_calls"`` for a choice that stopped on its own with calls)."""
    message, called = parsing.message(comp.text)
    if shape.echo:
        message["content"] = shape.echo + (message["content"] or "")
    return message, _finish_reason(comp, called)


def _finish_reason(comp: Any, called: bool) -> str | None:
    """``"tool_calls"`` for a choice that stopped on its own with calls, else its own reason."""
    return "tool_calls" if called and comp.finish_reason == "stop" else comp.finish_reason


def _chat_response(result: Any, request_id: str, created: int, model: str, top: int, tokenizer: Any, shape: Any, parsing: ChatParsing) -> FastJSONResponse:
    """The non-streaming body, logprobs included, serialised (in the worker pool)."""
    messages = {comp.index: _message(comp, shape, parsing) for comp in result.outputs}
    choices = [
        {
            "index": comp.index,
            "message": {**CHAT_MESSAGE_NULLS, **messages[comp.index][0]},
            "logprobs": chat_logprobs(comp, 0, len(comp.token_ids), top, tokenizer, shape.as_ids),
            "finish_reason": messages[comp.index][1],
            "stop_reason": comp.stop_reason,
            **({"token_ids": list(comp.token_ids)} if shape.token_ids else {}),
        }
        for comp in result.outputs
    ]
    return FastJSONResponse({
        "id": request_id, "object": "chat.completion", "created": created, "model": model,
        "choices": choices, "usage": usage([result], shape.details), **CHAT_RESPONSE_NULLS,
        "prompt_logprobs": prompt_logprobs_json(result, shape.prompt_logprobs) if shape.prompt_logprobs is not None else None,
        **({"prompt_token_ids": result.prompt_token_ids} if shape.token_ids else {}),
        **({"kv_transfer_params": result.kv_transfer_params} if result.kv_transfer_params is not None else {}),
    })


async def _stream_chat(gen, request_id, created, model, top, tokenizer, shape, parsing) -> AsyncIterator[str]:
    cursors: dict[int, ChoiceCursor] = {}
    streams: dict[int, Any] = {}
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
                    first = {**base, "choices": [{"index": comp.index, "delta": {"role": "assistant", "content": shape.echo}, "logprobs": None, "finish_reason": None}]}
                    if shape.token_ids:
                        first["prompt_token_ids"] = final.prompt_token_ids
                        first["choices"][0]["token_ids"] = []
                    if shape.continuous_usage:
                        first["usage"] = usage([final], shape.details, 0)
                    yield sse(first)
                finished = comp.finish_reason is not None
                if len(comp.text) == cur.text and not finished and len(comp.token_ids) == cur.tokens:
                    continue
                stream = streams.setdefault(comp.index, parsing.stream())
                delta = stream.feed(comp.text, finished)
                finish = _finish_reason(comp, stream.called) if finished else None
                chunk = {**base, "choices": [{
                    "index": comp.index,
                    "delta": delta,
                    "logprobs": chat_logprobs(comp, cur.tokens, len(comp.token_ids), top, tokenizer, shape.as_ids),
                    "finish_reason": finish,
                    "stop_reason": comp.stop_reason if finished else None,
                    **({"token_ids": list(comp.token_ids[cur.tokens:])} if shape.token_ids else {}),
                }]}
                if shape.continuous_usage:
                    chunk["usage"] = usage([final], shape.details, len(comp.token_ids))
                cur.text, cur.tokens, cur.done = len(comp.text), len(comp.token_ids), finished
                yield sse(chunk)
        if shape.include_usage and final is not None:
            yield sse({**base, "choices": [], "usage": usage([final], shape.details)})
    except Exception as exc:  # noqa: BLE001
        logger.warning("chat stream %s failed: %s", request_id, exc)
        yield error_event(exc)
    yield SSE_DONE


class ChatCompletionsEndpoint(EndpointPlugin):
    name = "openai_chat_completions"
    required_tasks = ("generate",)

    def attach_router(self, app: Any) -> None:
        app.state.tool_parser_cls, app.state.reasoning_parser_cls = resolve_parsers(app.state.settings)
        router = APIRouter()
        router.add_api_route("/v1/chat/completions", create_chat_completion, methods=["POST"], summary="Create a chat completion")
        app.include_router(router)

    def routes(self) -> list[tuple[str, str]]:
        return [("POST", "/v1/chat/completions")]
