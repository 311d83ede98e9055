"""Streaming one chat turn from the offline engine: yields text pieces as tokens arrive."""

from __future__ import annotations

from typing import Any, Iterator


def stream_chat(llm: Any, messages: list[dict[str, str]], params: Any) -> Iterator[str]:
    """Render the chat template and stream the reply through :meth:`LLM.stream`, yielding the
    new text after every step.

    Text comes from the output processor's incremental detokenizer: a character split across
    tokens is printed once complete, and text that could be the start of a stop string is held
    back. Closing the iterator early (Ctrl-C) aborts the request and frees its blocks.
    """
    tok = llm.get_tokenizer()
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt = {"prompt": text, "prompt_token_ids": tok.encode(text, add_special_tokens=False)}
    shown = 0
    for result in llm.stream(prompt, params):
        reply = result.outputs[0].text
        if len(reply) > shown:
            yield reply[shown:]
            shown = len(reply)
