"""Streaming one chat turn from the offline engine: yields text pieces as tokens arrive."""

from __future__ import annotations

from typing import Any, Iterator

from host.core.request import Request


def stream_chat(llm: Any, messages: list[dict[str, str]], params: Any) -> Iterator[str]:
    """Add one request and step the engine, yielding newly decodable text after every token.

    Text is re-decoded from all output tokens and only the stable new suffix is yielded, so a
    multi-byte character split across tokens is never printed half-way.
    """
    tok = llm.get_tokenizer()
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok.encode(text, add_special_tokens=False)
    req_id = f"chat-{llm.next_request_id()}"
    llm.engine.add_request(Request(req_id, ids, params, eos_token_id=llm.eos_token_id))
    tokens: list[int] = []
    printed = ""
    done = False
    while not done:
        for out in llm.engine.step().outputs:
            if out.req_id != req_id:
                continue
            tokens.extend(out.new_token_ids)
            done = out.finished
        current = tok.decode(tokens, skip_special_tokens=True)
        if current.endswith("\ufffd") and not done:
            continue  # an incomplete UTF-8 sequence: wait for the next token
        if current.startswith(printed):
            piece = current[len(printed):]
        else:
            piece = current  # decoding changed earlier text (rare); print the rest
        printed = current
        if piece:
            yield piece
