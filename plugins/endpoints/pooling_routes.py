"""``POST /pooling``, ``/v1/score`` (and ``/score``), ``/rerank`` (and ``/v1/rerank``,
``/v2/rerank``) as an endpoint plugin, for pooling models, in vLLM's request and response shapes.

- ``/pooling``: ``{"input": ..., "task": "encode"|"embed", "normalize", "dimensions",
  "encoding_format"}`` answers the raw pooled vectors (``task`` ``encode``, the default: no
  normalization unless asked) as ``{"data": [{"index", "object": "pooling", "data"}], "usage"}``;
  ``{"data": <payload>, "io_processor": NAME}`` runs the payload through an IO processor
  (:mod:`.io_processing`; the name may come from ``--io-processor`` or the model instead) and
  answers ``{"request_id", "created_at", "data"}``.
- ``/v1/score``: ``{"text_1": str | [str], "text_2": str | [str]}``: one ``text_1`` against each
  ``text_2``, or pairwise for two lists of one length; each score is the cosine similarity of
  the two texts' embeddings, ``{"data": [{"index", "object": "score", "score"}], "usage"}``.
- ``/rerank``: ``{"query", "documents": [str], "top_n"}``: the documents by descending cosine
  similarity to the query, ``{"results": [{"index", "document": {"text"}, "relevance_score"}],
  "usage"}``, the first ``top_n`` (all when 0 or unset).

A bad field is a 400 naming it.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal, Optional, Union

from fastapi import APIRouter, Request

from host.plugins.endpoints.common import FastJSONResponse, check_model, engine_of
from host.plugins.endpoints.io_processing import IOProcessors, run_processor
from host.plugins.endpoints.pooling_common import (
    MAX_INPUTS,
    cosine,
    encode_all,
    encode_vector,
    pooled_usage,
    pooling_params,
    split_inputs,
    token_ids,
)
from host.plugins.endpoints.protocol import _Body
from host.sdk import APIError, EndpointPlugin


class PoolingRequest(_Body):
    model: Optional[str] = None
    input: Any = None  # checked by split_inputs (one 400 naming "input" for every bad shape)
    task: Literal["encode", "embed"] = "encode"
    normalize: Optional[bool] = None
    dimensions: Optional[int] = None
    encoding_format: Literal["float", "base64"] = "float"
    # an IO processor's request: its payload, and which processor (else --io-processor / the model's)
    data: Any = None
    io_processor: Optional[str] = None


class ScoreRequest(_Body):
    model: Optional[str] = None
    text_1: Union[str, list[str]]
    text_2: Union[str, list[str]]
    normalize: Optional[bool] = None


class RerankRequest(_Body):
    model: Optional[str] = None
    query: str
    documents: list[str]
    top_n: Optional[int] = None
    return_documents: bool = True


async def _embed_texts(raw: Request, texts: list[str], param: str, request_id: str) -> list[Any]:
    params = pooling_params(raw.app.state.config, "score")
    prompts = await token_ids(raw, split_inputs(texts, param), param)
    return await encode_all(raw, prompts, params, request_id, param)


def _texts(value: str | list[str], param: str) -> list[str]:
    texts = [value] if isinstance(value, str) else list(value)
    if not texts:
        raise APIError(400, f"{param} must be a string or a non-empty list of strings", param=param)
    return texts


async def create_pooling(body: PoolingRequest, raw: Request) -> Any:
    engine_of(raw)
    model = check_model(raw, body.model)
    processors: IOProcessors = raw.app.state.io_processors
    if body.data is not None or (body.input is None and body.io_processor is not None):
        if body.input is not None:
            raise APIError(400, "send either input (plain pooling) or data (an IO processor's payload), not both", param="input")
        name = processors.pick(body.io_processor)
        if name is None:
            raise APIError(400, "data is an IO processor's payload, but none is selected: name one in io_processor "
                           "(or start the server with --io-processor NAME)", param="io_processor")
        return FastJSONResponse(await run_processor(raw, processors, name, body.data, pooling=True))
    if body.input is None:
        raise APIError(400, "input is required (or data, an IO processor's payload)", param="input")
    params = pooling_params(raw.app.state.config, body.task, body.normalize, body.dimensions)
    prompts = await token_ids(raw, split_inputs(body.input))
    request_id = f"pool-{uuid.uuid4().hex}"
    outputs = await encode_all(raw, prompts, params, request_id)
    data = [{"index": i, "object": "pooling", "data": encode_vector(o.outputs.data, body.encoding_format)} for i, o in enumerate(outputs)]
    return FastJSONResponse({"id": request_id, "object": "list", "created": int(time.time()), "model": model,
                             "data": data, "usage": pooled_usage(outputs)})


async def create_score(body: ScoreRequest, raw: Request) -> Any:
    engine_of(raw)
    model = check_model(raw, body.model)
    left, right = _texts(body.text_1, "text_1"), _texts(body.text_2, "text_2")
    if len(left) != 1 and len(left) != len(right):
        raise APIError(400, f"text_1 has {len(left)} entries and text_2 {len(right)}: send one text_1, or as many as text_2 "
                       "(scored pairwise)", param="text_1")
    if len(left) + len(right) > MAX_INPUTS:
        raise APIError(400, f"text_1 and text_2 hold {len(left) + len(right)} texts; at most {MAX_INPUTS} per request", param="text_2")
    request_id = f"score-{uuid.uuid4().hex}"
    outputs = await _embed_texts(raw, left + right, "text_1" if len(left) == 1 else "text_2", request_id)
    lv, rv = outputs[: len(left)], outputs[len(left):]
    pairs = [(lv[0] if len(lv) == 1 else lv[i], r) for i, r in enumerate(rv)]
    data = [{"index": i, "object": "score", "score": cosine(a.outputs.data, b.outputs.data)} for i, (a, b) in enumerate(pairs)]
    used = pooled_usage(outputs)
    return FastJSONResponse({"id": request_id, "object": "list", "created": int(time.time()), "model": model,
                             "data": data, "usage": {**used, "completion_tokens": 0}})


async def create_rerank(body: RerankRequest, raw: Request) -> Any:
    engine_of(raw)
    model = check_model(raw, body.model)
    if not body.query:
        raise APIError(400, "query must be a non-empty string", param="query")
    if not body.documents:
        raise APIError(400, "documents must be a non-empty list of strings", param="documents")
    if body.top_n is not None and body.top_n < 0:
        raise APIError(400, f"top_n={body.top_n} must be >= 0 (0 or unset: every document)", param="top_n")
    request_id = f"rerank-{uuid.uuid4().hex}"
    outputs = await _embed_texts(raw, [body.query, *body.documents], "documents", request_id)
    query, docs = outputs[0], outputs[1:]
    scored = sorted(((cosine(query.outputs.data, d.outputs.data), i) for i, d in enumerate(docs)), key=lambda si: (-si[0], si[1]))
    if body.top_n:
        scored = scored[: body.top_n]
    results = []
    for score, i in scored:
        entry: dict[str, Any] = {"index": i, "relevance_score": score}
        if body.return_documents:
            entry["document"] = {"text": body.documents[i]}
        results.append(entry)
    used = pooled_usage(outputs)
    return FastJSONResponse({"id": request_id, "model": model, "usage": {"total_tokens": used["total_tokens"]}, "results": results})


SCORE_PATHS = ("/score", "/v1/score")
RERANK_PATHS = ("/rerank", "/v1/rerank", "/v2/rerank")


class PoolingEndpoint(EndpointPlugin):
    """``/pooling``, the score and the rerank routes on a model that embeds. The server's IO
    processors (``app.state.io_processors``) are resolved when it attaches: an unknown
    ``--io-processor`` fails the start."""

    name = "pooling"
    required_tasks = ("embed",)

    def attach_router(self, app: Any) -> None:
        app.state.io_processors = IOProcessors(app.state.settings, app.state.config)
        router = APIRouter()
        router.add_api_route("/pooling", create_pooling, methods=["POST"], summary="Pooled vectors, or an IO processor's answer")
        for path in SCORE_PATHS:
            router.add_api_route(path, create_score, methods=["POST"], summary="Cosine similarity of text pairs")
        for path in RERANK_PATHS:
            router.add_api_route(path, create_rerank, methods=["POST"], summary="Documents by similarity to a query")
        app.include_router(router)

    def routes(self) -> list[tuple[str, str]]:
        return [("POST", "/pooling"), *(("POST", p) for p in SCORE_PATHS), *(("POST", p) for p in RERANK_PATHS)]
