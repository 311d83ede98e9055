"""``text_chunks``: embed a document longer than one step in overlapping token windows.

Payload: ``{"text": str, "chunk_tokens": int = 128, "overlap_tokens": int = 32}``. The text is
tokenized without special tokens and cut into windows of ``chunk_tokens`` tokens, each starting
``chunk_tokens - overlap_tokens`` after the previous one (the last may be shorter); each window,
with the tokenizer's special tokens around it (``[CLS] ... [SEP]`` for BERT), is one prompt the
pooling model embeds. Response: ``{"num_chunks", "chunks": [{"index", "start", "end", "text",
"embedding"}], "mean"}`` where ``start``/``end`` are token offsets into the document and ``mean``
is the plain (unweighted) mean of the chunk vectors.
"""

from __future__ import annotations

from typing import Any, Sequence

from host.sdk import IOProcessor


def _positive_int(data: dict[str, Any], key: str, default: int, minimum: int) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"text_chunks: {key}={value!r} must be an integer >= {minimum}")
    return value


def windows(n_tokens: int, size: int, overlap: int) -> list[tuple[int, int]]:
    """``(start, end)`` of each window over ``n_tokens`` tokens: ``size`` long, consecutive
    windows sharing ``overlap`` tokens; the last one ends at ``n_tokens``."""
    step = size - overlap
    spans, start = [], 0
    while True:
        end = min(start + size, n_tokens)
        spans.append((start, end))
        if end >= n_tokens:
            return spans
        start += step


def special_tokens_around(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after a text's own (``[CLS]`` / ``[SEP]`` for
    BERT, ``<s>`` for Llama), read off how it encodes a probe text with and without them."""
    bare = list(tokenizer("hello", add_special_tokens=False)["input_ids"])
    full = list(tokenizer("hello", add_special_tokens=True)["input_ids"])
    for i in range(len(full) - len(bare) + 1):
        if full[i:i + len(bare)] == bare:
            return full[:i], full[i + len(bare):]
    return [], []


class TextChunksProcessor(IOProcessor):
    name = "text_chunks"
    runner = "pooling"

    def __init__(self, config: Any = None, tokenizer: Any = None) -> None:
        super().__init__(config, tokenizer)
        self._pending: dict[str | None, list[tuple[int, int, str]]] = {}

    def parse_data(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise ValueError(f'text_chunks: the payload must be an object {{"text": ...}}, not {type(data).__name__}')
        unknown = sorted(set(data) - {"text", "chunk_tokens", "overlap_tokens"})
        if unknown:
            raise ValueError(f"text_chunks: unknown field(s) {', '.join(unknown)}; valid: text, chunk_tokens, overlap_tokens")
        text = data.get("text")
        if not isinstance(text, str) or not text.strip():
            raise ValueError('text_chunks: "text" must be a non-empty string')
        size = _positive_int(data, "chunk_tokens", 128, 1)
        overlap = _positive_int(data, "overlap_tokens", min(32, size - 1), 0)
        if overlap >= size:
            raise ValueError(f"text_chunks: overlap_tokens={overlap} must be smaller than chunk_tokens={size}")
        return {"text": text, "chunk_tokens": size, "overlap_tokens": overlap}

    def merge_pooling_params(self, params: Any = None, data: Any = None) -> Any:
        if params is not None:
            return params
        from host.sdk.pooling_params import PoolingParams

        return PoolingParams(task="embed")

    def pre_process(self, prompt: Any, request_id: str | None = None, **kwargs: Any) -> list[list[int]]:
        if self.tokenizer is None:
            raise ValueError("text_chunks needs the model's tokenizer (the server was started without one)")
        ids = list(self.tokenizer(prompt["text"], add_special_tokens=False)["input_ids"])
        if not ids:
            raise ValueError('text_chunks: "text" has no tokens')
        spans = windows(len(ids), prompt["chunk_tokens"], prompt["overlap_tokens"])
        self._pending[request_id] = [(s, e, self.tokenizer.decode(ids[s:e])) for s, e in spans]
        head, tail = special_tokens_around(self.tokenizer)
        return [[*head, *ids[s:e], *tail] for s, e in spans]

    def post_process(self, model_output: Sequence[Any], request_id: str | None = None, **kwargs: Any) -> dict[str, Any]:
        spans = self._pending.pop(request_id, None)
        vectors = [list(out.outputs.data) for out in model_output]
        if spans is None or len(spans) != len(vectors):
            raise ValueError(f"text_chunks: post_process got {len(vectors)} outputs for request {request_id!r}, "
                             "which pre_process did not cut into that many chunks")
        mean = [sum(col) / len(vectors) for col in zip(*vectors)]
        chunks = [{"index": i, "start": s, "end": e, "text": t, "embedding": v} for i, ((s, e, t), v) in enumerate(zip(spans, vectors))]
        return {"num_chunks": len(chunks), "chunks": chunks, "mean": mean}

    def discard(self, request_id: str | None) -> None:
        """Forget a request whose engine work failed (post_process will not be called)."""
        self._pending.pop(request_id, None)
