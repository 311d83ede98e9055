"""``host generate`` and ``host chat``: the offline engine from the terminal."""

from __future__ import annotations

import sys
from typing import Any, Optional

import typer

ModelOpt = typer.Option(None, "--model", "-m", help="HF model directory or .gguf file (default: SmolLM2-135M-Instruct).")


def _engine_kwargs(**kw: Any) -> dict[str, Any]:
    return {k: v for k, v in kw.items() if v is not None}


def generate_cmd(
    prompt: list[str] = typer.Argument(..., help="One or more prompts."),
    model: Optional[str] = ModelOpt,
    max_tokens: int = typer.Option(64, "--max-tokens", help="Tokens to generate per prompt."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 means greedy."),
    dtype: Optional[str] = typer.Option(None, "--dtype"),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs"),
    max_num_batched_tokens: Optional[int] = typer.Option(None, "--max-num-batched-tokens"),
    plugins: Optional[str] = typer.Option(None, "--plugins"),
) -> None:
    """Complete each PROMPT with the model and print the results."""
    from host import LLM, SamplingParams

    try:
        llm = LLM(model, plugins=plugins, **_engine_kwargs(dtype=dtype, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens))
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature)
        outputs = llm.generate(list(prompt), params)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2)
    for out in outputs:
        if len(outputs) > 1:
            typer.echo(f"--- {out.prompt!r}")
        typer.echo(out.prompt + out.outputs[0].text if out.prompt else out.outputs[0].text)


def chat_cmd(
    model: Optional[str] = ModelOpt,
    max_tokens: int = typer.Option(256, "--max-tokens"),
    temperature: float = typer.Option(0.0, "--temperature"),
    system: Optional[str] = typer.Option(None, "--system", help="System prompt."),
    plugins: Optional[str] = typer.Option(None, "--plugins"),
) -> None:
    """Chat with the model in the terminal; tokens are printed as they are generated.
    An empty line or Ctrl-D ends the session."""
    from host import LLM, SamplingParams
    from host.core.chat_stream import stream_chat

    llm = LLM(model, plugins=plugins)
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
