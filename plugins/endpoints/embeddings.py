"""``POST /v1/embeddings`` (OpenAI's embeddings API) as an endpoint plugin, for pooling models.

``input``: a string, a list of strings, a list of token ids, or a list of token-id lists (at most
2048); ``encoding_format``: ``float`` (the default) or ``base64`` (little-endian float32 bytes,
what the OpenAI client asks for by default and decodes itself); ``dimensions``: keep the first
``dimensions`` values, re-normalized (Matryoshka truncation; refused where the model's config
says it was not trained for it); vLLM's ``normalize`` extension overrides the model's default.
All inputs run at once; ``data`` comes back in input order with each entry's ``index``, and
``usage`` counts the prompt tokens. A bad field is a 400 naming it; a generative model answers
400 naming ``--convert embed`` (:mod:`.wrong_runner`).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal, Optional

from fastapi import APIRouter, Request

from host.plugins.endpoints.common import FastJSONResponse, check_model, engine_of
from host.plugins.endpoints.pooling_common import (
    encode_all,
    encode_vector,
    pooled_usage,
    pooling_params,
    split_inputs,
    token_ids,
)
from host.plugins.endpoints.protocol import _Body
from host.sdk import APIError, EndpointPlugin


class EmbeddingRequest(_Body):
    model: Optional[str] = None
    input: Any = None  # checked by split_inputs, so every bad shape is one 400 naming "input"
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = None
    user: Optional[str] = None
    normalize: Optional[bool] = None  # vLLM's extension: None = the model's default


async def create_embeddings(body: EmbeddingRequest, raw: Request) -> Any:
    engine_of(raw)
    model = check_model(raw, body.model)
    config = raw.app.state.config
    if body.input is None:
        raise APIError(400, "input is required: a string, a list of strings, or token ids", param="input")
    params = pooling_params(config, "embed", body.normalize, body.dimensions)
    items = split_inputs(body.input)
    prompts = await token_ids(raw, items)
    request_id = f"embd-{uuid.uuid4().hex}"
    outputs = await encode_all(raw, prompts, params, request_id)
    data = [
        {"object": "embedding", "index": i, "embedding": encode_vector(out.outputs.data, body.encoding_format)}
        for i, out in enumerate(outputs)
    ]
    return FastJSONResponse({
        "id": request_id, "object": "list", "created": int(time.time()), "model": model,
        "data": data, "usage": pooled_usage(outputs),
    })


class EmbeddingsEndpoint(EndpointPlugin):
    """``POST /v1/embeddings`` on a model that embeds (``BertModel``, ``--convert embed``)."""

    name = "openai_embeddings"
    required_tasks = ("embed",)

    def attach_router(self, app: Any) -> None:
        router = APIRouter()
        router.add_api_route("/v1/embeddings", create_embeddings, methods=["POST"], summary="Create embeddings (OpenAI)")
        app.include_router(router)

    def routes(self) -> list[tuple[str, str]]:
        return [("POST", "/v1/embeddings")]
