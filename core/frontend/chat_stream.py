"""Streaming one chat turn from the offline engine: yields text pieces as tokens arrive."""

from __future__ import annotations

from typing import Any, Iterator

from host.core.frontend.detokenizer import IncrementalDetokenizer
from host.core.scheduler.request import Request, RequestStatus


def stream_chat(llm: Any, messages: list[dict[str, str]], params: Any) -> Iterator[str]:
    """Add one request and step the engine, yielding new text after every token.

    Text comes from the incremental detokenizer: a character split across tokens is printed
    once complete, and text that could be the start of a stop string is held back.
    """
    tok = llm.get_tokenizer()
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok.encode(text, add_special_tokens=False)
    req_id = f"chat-{llm.next_request_id()}"
    detok = IncrementalDetokenizer(tok, params, ids)
    llm.engine.add_request(Request(req_id, ids, params, eos_token_id=llm.eos_token_id))
    done = False
    try:
        while not done:
            for out in llm.engine.step().outputs:
                if out.req_id != req_id:
                    continue
                stop_str = detok.update(out.new_token_ids, out.finish_reason == "stop")
                done = out.finished or stop_str is not None
                if stop_str is not None and not out.finished:
                    llm.engine.finish_requests([req_id], RequestStatus.FINISHED_STOPPED)
            piece = detok.get_next_output_text(done, delta=True)
            if piece:
                yield piece
    finally:
        if not done:  # the consumer stopped early (Ctrl-C): free the request's blocks
            llm.engine.abort_requests([req_id])
