"""Chat templating for the API routes (API process), off the event loop and, for a template a
request brought, only when the operator allowed it and with a time bound.

The model's own templates (its default and its named ones, e.g. ``tool_use``) are trusted.
A request may name one of those in ``chat_template_kwargs.chat_template``; a template *text*
there is refused with 400 unless the server runs with ``--trust-request-chat-template``
(a Jinja template is code: a nested loop holds a CPU forever, the class of vLLM's
CVE-2025-61620). When allowed, it renders in transformers' ``apply_chat_template``, which
compiles every template in jinja2's ``ImmutableSandboxedEnvironment`` (no attribute or
mutation escapes; ``range`` capped at 100,000 items), and:

- within :data:`REQUEST_TEMPLATE_SECONDS` of wall-clock time: the render runs in a worker
  thread under a trace function that, inside the template's own frames (jinja compiles them
  with the file name ``<template>``), raises :class:`TemplateTimeout` at the first line past
  the deadline. The render thus stops itself — a Python thread cannot be killed from outside —
  and the request gets a 400. One C-level operation (a huge ``'x' * n``) cannot be
  interrupted; memory bounds it, which is why request templates are off by default;
- producing at most :func:`request_template_output_cap` characters (400 beyond), so its output
  never reaches the tokenizer at a size no prompt could have.

Rendering and tokenizing run in :func:`host.plugins.endpoints.common.off_loop`'s thread pool,
so a large conversation never blocks ``/health`` or other requests.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

from host.sdk import APIError

REQUEST_TEMPLATE_SECONDS = 5.0
"""How long a request-supplied template may render before it is stopped (400)."""

TRUST_FLAG = "--trust-request-chat-template"


class TemplateTimeout(Exception):
    """A request-supplied template ran past :data:`REQUEST_TEMPLATE_SECONDS`."""


def request_template_output_cap(max_request_bytes: int) -> int:
    """The most characters a request-supplied template may produce: twice the largest body plus
    1 MiB of template text, more than any honest rendering of a request that fit the limit."""
    return 2 * max_request_bytes + (1 << 20)


def _named_templates(tokenizer: Any) -> set[str]:
    templates = getattr(tokenizer, "chat_template", None)
    return set(templates) if isinstance(templates, dict) else set()


def request_template(tokenizer: Any, kwargs: dict[str, Any], trusted: bool) -> str | None:
    """The template text a request brought in ``kwargs["chat_template"]`` (``None`` when it
    brought none or named one of the model's own); 400 when it brought one and the server does
    not trust request templates."""
    value = kwargs.get("chat_template")
    if value is None or (isinstance(value, str) and value in _named_templates(tokenizer)):
        return None
    if not isinstance(value, str):
        raise APIError(400, "chat_template_kwargs.chat_template must be a string", param="chat_template_kwargs.chat_template")
    if not trusted:
        raise APIError(
            400,
            "this server does not render chat templates sent in requests (chat_template_kwargs.chat_template); "
            f"use the model's template, or start the server with {TRUST_FLAG}",
            param="chat_template_kwargs.chat_template",
        )
    return value


def run_with_deadline(fn: Callable[[], Any], seconds: float) -> Any:
    """``fn()`` in this thread, stopped with :class:`TemplateTimeout` once a Jinja template
    frame executes a line after ``seconds`` have passed. Other frames are not traced, so the
    cost falls on template code only."""
    deadline = time.monotonic() + seconds

    def in_template(frame: Any, event: str, arg: Any) -> Any:
        if time.monotonic() > deadline:
            raise TemplateTimeout(f"the request's chat template ran for more than {seconds:g} s")
        return in_template

    def on_call(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename == "<template>":
            return in_template(frame, event, arg)
        return None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        return fn()
    finally:
        sys.settrace(previous)


def apply_template(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    *,
    kwargs: dict[str, Any],
    trusted: bool,
    max_request_bytes: int,
    template: str | None = None,
    **options: Any,
) -> str:
    """The prompt text of ``messages`` (call in a worker thread). ``kwargs`` are the request's
    ``chat_template_kwargs``; ``template`` is the server's ``--chat-template`` text (trusted: the
    operator's), used instead of the tokenizer's unless the request names or brings one;
    ``options`` go to ``apply_chat_template`` as they are. Every failure is an
    :class:`APIError` 400."""
    own = request_template(tokenizer, kwargs, trusted)
    if template is not None and kwargs.get("chat_template") is None:
        kwargs = {**kwargs, "chat_template": template}

    def render() -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False, **options, **kwargs)

    try:
        if own is None:
            return render()
        text = run_with_deadline(render, REQUEST_TEMPLATE_SECONDS)
    except APIError:
        raise
    except TemplateTimeout as exc:
        raise APIError(400, f"{exc}; simplify the template", param="chat_template_kwargs.chat_template") from None
    except Exception as exc:  # noqa: BLE001 - a template error is the request's fault
        raise APIError(400, f"the chat template could not render these messages: {exc}", param="messages") from None
    cap = request_template_output_cap(max_request_bytes)
    if len(text) > cap:
        raise APIError(
            400, f"the request's chat template produced {len(text)} characters, more than the {cap} allowed",
            param="chat_template_kwargs.chat_template",
        )
    return text
