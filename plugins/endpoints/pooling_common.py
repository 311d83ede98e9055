"""What the pooling routes share (``/v1/embeddings`` in :mod:`.embeddings`; ``/pooling``,
``/v1/score`` and ``/rerank`` in :mod:`.pooling_routes`): the inputs as token ids, the pooling
parameters (``dimensions`` checked against the model), running many prompts through
``AsyncLLM.encode`` at once (results in input order; on a failure the others are cancelled,
which aborts them in the engine), the vectors as JSON floats or base64, usage, and cosine
similarity."""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np
from fastapi import Request

from host.plugins.endpoints.common import encode_text, off_loop, run_to_end, tokenizer_process
from host.plugins.endpoints.openai_common import gather_all_or_cancel
from host.sdk import APIError
from host.sdk.pooling_params import PoolingParams

MAX_INPUTS = 2048
"""Most inputs one request may carry (OpenAI's cap for ``/v1/embeddings``)."""

_INPUT_SHAPES = "a non-empty string, a list of strings, a list of token ids, or a list of token-id lists"


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def split_inputs(value: Any, param: str = "input") -> list[str | list[int]]:
    """The prompts of an ``input`` field: each a text or a list of token ids; a 400 naming
    ``param`` for anything else (an empty string or list, a mixed list, more than
    :data:`MAX_INPUTS`)."""
    if isinstance(value, str) or _is_ids(value):
        value = [value]
    if not isinstance(value, list) or not value:
        raise APIError(400, f"{param} must be {_INPUT_SHAPES}", param=param)
    if len(value) > MAX_INPUTS:
        raise APIError(400, f"{param} has {len(value)} entries; at most {MAX_INPUTS} per request", param=param)
    for i, item in enumerate(value):
        if isinstance(item, str):
            if not item:
                raise APIError(400, f"{param}[{i}] is an empty string; every input must hold some text", param=param)
        elif not _is_ids(item):
            raise APIError(400, f"{param}[{i}] is {type(item).__name__}; {param} must be {_INPUT_SHAPES}", param=param)
    return value


def _tokenize_all(items: list[str | list[int]], tokenizer: Any, process: Any, vocab: int | None, param: str) -> list[list[int]]:
    out = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            out.append(encode_text(tokenizer, item, process=process, param=param))
        else:
            if vocab is not None and any(t < 0 or t >= vocab for t in item):
                bad = next(t for t in item if t < 0 or t >= vocab)
                raise APIError(400, f"{param}[{i}] holds token id {bad}, out of vocabulary (the vocabulary is [0, {vocab}))", param=param)
            out.append(list(item))
    return out


async def token_ids(raw: Request, items: list[str | list[int]], param: str = "input") -> list[list[int]]:
    """Each prompt's token ids (texts tokenized with the model's special tokens, off the event loop)."""
    engine = raw.app.state.engine
    tokenizer = engine.tokenizer
    vocab = getattr(getattr(raw.app.state.config.model, "hf_config", None), "vocab_size", None)
    return await off_loop(_tokenize_all, items, tokenizer, tokenizer_process(raw), vocab, param)


def hidden_size(config: Any) -> int | None:
    return getattr(getattr(config.model, "hf_config", None), "hidden_size", None)


def check_dimensions(config: Any, dimensions: int | None) -> None:
    """``dimensions`` (Matryoshka truncation) where the model allows it: at most its embedding
    size, one of its ``matryoshka_dimensions`` when its config lists them, and never on a model
    whose config says ``is_matryoshka: false``. A 400 naming ``dimensions`` otherwise."""
    if dimensions is None:
        return
    if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1:
        raise APIError(400, f"dimensions={dimensions!r} must be a positive integer", param="dimensions")
    hf = getattr(config.model, "hf_config", None)
    allowed = getattr(hf, "matryoshka_dimensions", None)
    if getattr(hf, "is_matryoshka", None) is False:
        raise APIError(400, "this model's config says is_matryoshka: false: its embeddings cannot be truncated; "
                       "leave dimensions unset", param="dimensions")
    if allowed and dimensions not in allowed:
        raise APIError(400, f"dimensions={dimensions} is not one this model was trained for; use one of "
                       f"{', '.join(map(str, allowed))}", param="dimensions")
    size = hidden_size(config)
    if size is not None and dimensions > size:
        raise APIError(400, f"dimensions={dimensions} exceeds the model's embedding size {size}; use dimensions <= {size} "
                       "or leave it unset", param="dimensions")


def pooling_params(config: Any, task: str = "embed", normalize: bool | None = None, dimensions: int | None = None) -> PoolingParams:
    check_dimensions(config, dimensions)
    try:
        return PoolingParams(task=task, normalize=normalize, dimensions=dimensions)
    except ValueError as exc:
        raise APIError(400, str(exc), param="dimensions" if "dimensions" in str(exc) else "normalize") from None


async def encode_all(
    raw: Request, prompts: list[list[int]], params: PoolingParams, request_id: str, param: str = "input",
) -> list[Any]:
    """One :class:`PoolingRequestOutput` per prompt, in order, all in flight together (the
    scheduler batches them); a prompt the engine refuses is a 400 naming ``param``."""
    engine = raw.app.state.engine
    engine.admit()

    async def one(i: int, ids: list[int]) -> Any:
        try:
            return await run_to_end(raw, engine.encode(ids, params, request_id=f"{request_id}-{i}"))
        except ValueError as exc:
            raise APIError(400, f"{param}[{i}]: {exc}", param=param) from None

    return await gather_all_or_cancel([one(i, ids) for i, ids in enumerate(prompts)])


def encode_vector(values: list[float], encoding_format: str) -> list[float] | str:
    """``float``: the values; ``base64``: their little-endian float32 bytes, base64 encoded (what
    the OpenAI client decodes with ``np.frombuffer(..., dtype="float32")``)."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(values, dtype="<f4").tobytes()).decode("ascii")
    return [float(v) for v in values]


def pooled_usage(outputs: list[Any]) -> dict[str, int]:
    tokens = sum(len(o.prompt_token_ids) for o in outputs)
    return {"prompt_tokens": tokens, "total_tokens": tokens}


def cosine(a: list[float], b: list[float]) -> float:
    """Cosine similarity of two vectors (0 when one is all zeros)."""
    va, vb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    denom = float(np.linalg.norm(va) * np.linalg.norm(vb))
    return float(va @ vb / denom) if denom > 0 and math.isfinite(denom) else 0.0
