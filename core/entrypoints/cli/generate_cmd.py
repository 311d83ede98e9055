"""``host generate`` and ``host chat``: the offline engine from the terminal.

Both take every engine flag (``engine_flags``), vLLM's ``--compilation-config`` (its JSON,
dotted and ``-O.KEY`` forms, :mod:`.nested_configs`) and the plugin flags (``plugin_flags``); the
engine runs in this process (``LLM``)."""

from __future__ import annotations

import logging
import sys
from typing import Any, Optional

import typer

from host.core.entrypoints.cli.engine_flags import with_engine_flags
from host.core.entrypoints.cli.nested_configs import Translated, log_nested_notes, merge_flags, with_nested_configs
from host.core.entrypoints.cli.plugin_flags import with_plugin_flags


def _with_nested(engine_kwargs: dict[str, Any], nested: Translated) -> dict[str, Any]:
    """The engine flags with ``--compilation-config``'s translated keys (its notes logged)."""
    log_nested_notes(nested, logging.getLogger("host.cli"))
    return merge_flags(engine_kwargs, nested.engine, lambda name: "--" + name.replace("_", "-"))


@with_nested_configs("--compilation-config")
@with_plugin_flags
@with_engine_flags()
def generate_cmd(
    prompt: list[str] = typer.Argument(..., help="One or more prompts."),
    max_tokens: int = typer.Option(64, "--max-tokens", help="Tokens to generate per prompt."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 means greedy."),
    lora_modules: Optional[list[str]] = typer.Option(
        None, "--lora-modules",
        help='A LoRA adapter (with --enable-lora): NAME=PATH or \'{"name": ..., "path": ...}\'; repeat for more. '
        "Every prompt runs with each adapter given (docs/lora.md).",
    ),
    *,
    engine_kwargs: dict[str, Any],
    plugin_flags: dict[str, Any],
    nested_configs: Translated,
) -> None:
    """Complete each PROMPT with the model and print the results."""
    from host import LLM, SamplingParams
    from host.core.lora.frontend import lora_requests_from_modules

    try:
        engine_kwargs = _with_nested(engine_kwargs, nested_configs)
        adapters = lora_requests_from_modules(list(lora_modules or []))
        if adapters and not engine_kwargs.get("enable_lora"):
            raise ValueError("--lora-modules needs --enable-lora (the engine then reserves the adapter slots)")
        llm = LLM(**plugin_flags, **engine_kwargs)
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature)
        runs = [(r, p) for r in adapters for p in prompt] if adapters else [(None, p) for p in prompt]
        outputs = llm.generate([p for _, p in runs], params, lora_request=[r for r, _ in runs])
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2)
    for (adapter, _), out in zip(runs, outputs):
        if len(outputs) > 1:
            typer.echo(f"--- {out.prompt!r}" + (f" [{adapter.lora_name}]" if adapter is not None else ""))
        typer.echo(out.prompt + out.outputs[0].text if out.prompt else out.outputs[0].text)


@with_nested_configs("--compilation-config")
@with_plugin_flags
@with_engine_flags()
def chat_cmd(
    max_tokens: int = typer.Option(256, "--max-tokens", help="Tokens to generate per reply."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 means greedy."),
    system: Optional[str] = typer.Option(None, "--system", help="System prompt."),
    *,
    engine_kwargs: dict[str, Any],
    plugin_flags: dict[str, Any],
    nested_configs: Translated,
) -> None:
    """Chat with the model in the terminal; tokens are printed as they are generated.
    An empty line or Ctrl-D ends the session."""
    from host import LLM, SamplingParams
    from host.core.frontend.chat_stream import stream_chat

    try:
        llm = LLM(**plugin_flags, **_with_nested(engine_kwargs, nested_configs))
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2)
    messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature)
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            typer.echo("you> ", nl=False)
        line = sys.stdin.readline()
        if not line or not line.strip():
            break
        messages.append({"role": "user", "content": line.strip()})
        if interactive:
            typer.echo("assistant> ", nl=False)
        reply = ""
        for piece in stream_chat(llm, messages, params):
            reply += piece
            typer.echo(piece, nl=False)
            sys.stdout.flush()
        typer.echo("")
        messages.append({"role": "assistant", "content": reply})
