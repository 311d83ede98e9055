"""What the OpenAI routes share (``/v1/completions`` in :mod:`.completions`, ``/v1/chat/completions``
in :mod:`.chat`): usage counts (``prompt_tokens_details`` under
``--enable-prompt-tokens-details``), logprob formatting, the response extensions a request asks
for (:class:`ResponseShape`), prompt truncation, the ``stream_options`` rules, the
sampling-parameter translation, the sequence cap, running several generations to the end or
merging their streams, and the in-band error event of a stream that already started."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Callable

from fastapi import Request

from host.plugins.endpoints.common import sse
from host.sdk import APIError
from host.sdk.sampling_params import BeamSearchParams

logger = logging.getLogger("host.api")

# The fields of the official client's response models (openai 3.57) that host has no value for,
# sent as null so that a body has every key the client's model declares: a client's
# ``model_dump()`` then equals the raw JSON (vLLM's test_invocations compares the two), as
# vLLM's responses do.
CHAT_RESPONSE_NULLS: dict[str, Any] = {"metadata": None, "moderation": None, "service_tier": None, "system_fingerprint": None}
"""``ChatCompletion``'s fields host leaves null."""
CHAT_MESSAGE_NULLS: dict[str, Any] = {"refusal": None, "annotations": None, "audio": None, "function_call": None, "tool_calls": None}
"""``ChatCompletionMessage``'s fields host leaves null (``tool_calls`` is set when there are calls)."""
COMPLETION_RESPONSE_NULLS: dict[str, Any] = {"system_fingerprint": None}
"""``Completion``'s fields host leaves null."""


def merge_choices(results: list[Any], n: int) -> list[tuple[int, Any]]:
    """``(choice index, CompletionOutput)`` over prompts, ``n`` choices each."""
    return [(p * n + c.index, c) for p, res in enumerate(results) for c in res.outputs]


def usage(results: list[Any], details: bool = False, completion: int | None = None) -> dict[str, Any]:
    """The ``usage`` object of ``results`` (one per prompt; ``n`` samples each share the prompt's
    count). ``completion`` overrides the generated-token count (echo with ``max_tokens=0``
    returns none of the one token it had to generate). With ``details``
    (``--enable-prompt-tokens-details``) ``prompt_tokens_details.cached_tokens`` is the prompt
    tokens the prefix cache served, always filled (0 included) where vLLM omits a zero."""
    prompt = sum(len(r.prompt_token_ids) for r in results)
    if completion is None:
        completion = sum(len(c.token_ids) for r in results for c in r.outputs)
    out: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if details:
        out["prompt_tokens_details"] = {"cached_tokens": sum(r.num_cached_tokens for r in results)}
    return out


class ResponseShape:
    """What a request asks of its answer beyond the text: token ids (``return_token_ids``),
    logprob tokens as ``"token_id:<id>"`` (``return_tokens_as_token_ids``), its prompt's
    logprobs, usage details (``--enable-prompt-tokens-details``), a final usage chunk
    (``stream_options.include_usage``) and usage on every chunk (``continuous_usage_stats``,
    with ``include_usage``, as vLLM)."""

    def __init__(self, body: Any, settings: Any) -> None:
        self.token_ids = bool(body.return_token_ids)
        self.as_ids = bool(body.return_tokens_as_token_ids)
        self.prompt_logprobs: int | None = body.prompt_logprobs  # the width asked (None: not asked)
        self.details = bool(getattr(settings, "enable_prompt_tokens_details", False))
        opts = body.stream_options
        self.include_usage = bool(opts and opts.include_usage)
        self.continuous_usage = self.include_usage and bool(opts and opts.continuous_usage_stats)
        self.echo = ""  # chat: the text that leads the reply (echo of the final assistant message)


def chat_echo(body: Any) -> str:
    """Chat ``echo``: the final message's text when it is the assistant's (vLLM's rule; with
    ``continue_final_message`` the reply continues it), else ``""``."""
    if not getattr(body, "echo", False) or not body.messages:
        return ""
    last = body.messages[-1]
    if not isinstance(last, dict) or last.get("role") != "assistant":
        return ""
    content = last.get("content")
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content if isinstance(content, str) else ""


def check_stream_options(body: Any) -> None:
    """``stream_options`` only with ``stream: true``, and no ``prompt_logprobs`` in a stream
    (vLLM's 400s; ``prompt_logprobs: 0`` passes, as on vLLM, and a stream carries none)."""
    if body.stream_options is not None and not body.stream:
        raise APIError(400, "Stream options can only be defined when `stream=True`.", param="stream_options")
    if body.stream and body.prompt_logprobs not in (None, 0):
        raise APIError(400, "`prompt_logprobs` are not available when `stream=True`; "
                       "ask for them in a request without streaming", param="prompt_logprobs")


def prompt_truncation(body: Any, max_model_len: int) -> Callable[[list[int]], list[int]]:
    """The function that applies ``truncate_prompt_tokens`` (keep that many prompt tokens; -1:
    ``max_model_len``) and ``truncation_side`` (``"left"``, the default, drops the start and keeps
    the end; ``"right"`` keeps the start) to a prompt's ids. A value outside ``[1,
    max_model_len]`` (other than -1) is a 400 naming it and the range."""
    keep = body.truncate_prompt_tokens
    if keep is None:
        return lambda ids: ids
    if keep == -1:
        keep = max_model_len
    if isinstance(keep, bool) or not 1 <= keep <= max_model_len:
        raise APIError(
            400, f"truncate_prompt_tokens={body.truncate_prompt_tokens} must be -1 (max_model_len) or in "
            f"[1, {max_model_len}] (this server's max_model_len); select a smaller truncation size",
            param="truncate_prompt_tokens",
        )
    if body.truncation_side == "right":
        return lambda ids: ids[:keep]
    return lambda ids: ids[-keep:] if len(ids) > keep else ids


def token_label(tok: int, lp: Any, tokenizer: Any, as_ids: bool) -> str:
    """How a logprob entry names its token: its text, or ``"token_id:<id>"`` with
    ``return_tokens_as_token_ids``."""
    return f"token_id:{tok}" if as_ids else token_str(lp, tok, tokenizer)


def token_str(lp: Any, tok: int, tokenizer: Any) -> str:
    if lp is not None and lp.decoded_token is not None:
        return lp.decoded_token
    return tokenizer.decode([tok]) if tokenizer is not None else str(tok)


LOGPROB_FLOOR = -9999.0
"""Reported logprobs are clamped here (vLLM's floor): ``-inf`` is not JSON, and a client summing
them (lm-evaluation-harness) needs numbers."""


def logprobs_object(
    entries: list[tuple[int, Any]], top: int, text_offset: int, tokenizer: Any, as_ids: bool = False,
) -> dict[str, Any]:
    """The completions ``logprobs`` object (``tokens``, ``token_logprobs``, ``top_logprobs``,
    ``text_offset``) of ``(token id, {token: Logprob} or None)`` entries. ``None`` (the first
    prompt token under ``echo``, which nothing predicts) gives a ``null`` logprob and top. ``top``
    keeps the token itself and those ranked ``<= top`` (-1: every entry given). Each offset is the
    previous one plus the previous token's text length."""
    tokens: list[str] = []
    values: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    offset = text_offset
    for tok, pos in entries:
        if pos is None:
            text = token_label(tok, None, tokenizer, as_ids)
            values.append(None)
            tops.append(None)
        else:
            chosen = pos.get(tok)
            text = token_label(tok, chosen, tokenizer, as_ids)
            values.append(max(chosen.logprob, LOGPROB_FLOOR) if chosen is not None else None)
            tops.append({
                token_label(t, lp, tokenizer, as_ids): max(lp.logprob, LOGPROB_FLOOR)
                for t, lp in pos.items()
                if top < 0 or t == tok or (lp.rank is not None and lp.rank <= top)
            })
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(comp: Any, start: int, end: int, top: int, tokenizer: Any, as_ids: bool = False) -> dict[str, Any] | None:
    if comp.logprobs is None:
        return None
    content = []
    for tok, pos in zip(comp.token_ids[start:end], comp.logprobs[start:end]):
        text = token_label(tok, pos.get(tok), tokenizer, as_ids)
        ranked = sorted(pos.items(), key=lambda kv: -kv[1].logprob)
        ranked = ranked if top < 0 else ranked[:top]  # -1 (allowed by --max-logprobs -1): all
        content.append({
            "token": text,
            "logprob": pos[tok].logprob,
            "bytes": list(text.encode()),
            "top_logprobs": [
                {"token": label, "logprob": lp.logprob, "bytes": list(label.encode())}
                for t, lp in ranked
                for label in (token_label(t, lp, tokenizer, as_ids),)
            ],
        })
    return {"content": content}


def prompt_logprobs_json(result: Any, width: int) -> list[Any] | None:
    """vLLM's shape: one entry per prompt token (``None`` for the first), each
    ``{token_id: {"logprob", "rank", "decoded_token"}}`` with string keys (JSON), holding the
    ``width`` most likely tokens (-1: all computed) plus the prompt token itself when it is not
    among them — ``width`` or ``width + 1`` entries, as vLLM. The engine may have computed more
    (completions' ``echo`` with a larger ``logprobs``); those are left out."""
    if result.prompt_logprobs is None:
        return None
    return [
        None if pos is None else {
            str(t): {"logprob": max(lp.logprob, LOGPROB_FLOOR), "rank": lp.rank, "decoded_token": lp.decoded_token}
            for t, lp in pos.items()
            if width < 0 or t == tok or (lp.rank is not None and lp.rank <= width)
        }
        for tok, pos in zip(result.prompt_token_ids, result.prompt_logprobs)
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
        self.echo_len = 0  # characters of echoed prompt sent before the completion's text


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


def generations(engine: Any, body: Any, params: Any, prompts: list[tuple[str | None, list[int]]], request_id: str,
                deadline: float | None, lora_request: Any = None) -> list[AsyncIterator[Any]]:
    """One stream of ``RequestOutput`` snapshots per ``(text, ids)`` prompt, ids ``<request_id>-<i>``:
    the engine's generation (with the LoRA adapter ``model`` named, ``lora_request``), or with
    ``use_beam_search`` the beam search's one finished output (``n`` beams returned, ``best_of``
    kept). Sampling settings beam search cannot honour are a 400 naming them."""
    if not body.use_beam_search:
        return [
            engine.generate(ids, params, f"{request_id}-{i}", prompt=text, priority=body.priority, deadline=deadline,
                            kv_transfer_params=body.kv_transfer_params, lora_request=lora_request)
            for i, (text, ids) in enumerate(prompts)
        ]
    if lora_request is not None:
        raise APIError(400, f"use_beam_search is not supported with a LoRA adapter (model={lora_request.lora_name!r}); "
                       "sample without beam search, or search on the base model", param="use_beam_search")
    try:
        beam = BeamSearchParams.from_sampling_params(
            params, length_penalty=body.length_penalty, early_stopping=body.early_stopping, best_of=getattr(body, "best_of", None),
        )
    except ValueError as exc:
        raise APIError(400, str(exc), param="use_beam_search") from None
    return [_beam_stream(engine, ids, beam, f"{request_id}-{i}", text, body.priority, deadline) for i, (text, ids) in enumerate(prompts)]


async def _beam_stream(engine: Any, ids: list[int], beam: Any, request_id: str, text: str | None, priority: int,
                       deadline: float | None) -> AsyncIterator[Any]:
    yield await engine.beam_search(ids, beam, request_id, prompt=text, priority=priority, deadline=deadline)

