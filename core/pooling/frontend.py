"""The front end's pooling requests (process 0): checks, the engine request, the result.

A pooling request travels the generation path: the input processor builds an
:class:`EngineCoreRequest` with ``pooling_params`` set (its ``sampling_params`` a placeholder
for one step: nothing is sampled), the output processor tracks it, and its one engine output
carries the pooled vector (``EngineCoreOutput.pooling_output``, kept on the
:class:`RequestOutput` as ``pooling_output``). :func:`to_pooling_output` turns that into the
caller's :class:`PoolingRequestOutput`. ``LLM.encode`` / ``LLM.embed`` and ``AsyncLLM.encode``
are built on these (:func:`encode_offline`, :func:`encode_async`).

The checks (``ValueError``, HTTP 400): a pooling request on a generating model names
``--convert embed``; a generation request on a pooling model names ``--runner generate``; a
prompt longer than ``--max-model-len`` or than one step's budget (``--max-num-batched-tokens``:
a pooling prompt runs in one step) names that flag; ``dimensions`` above the model's size.
"""

from __future__ import annotations

import time
from typing import Any, AsyncIterator, Sequence

from host.contracts.messages import EngineCoreRequest
from host.contracts.pooling_params import PoolingParams
from host.contracts.sampling_params import SamplingParams
from host.core.pooling.output import EmbeddingRequestOutput, PoolingOutput, PoolingRequestOutput


def _one_step_params() -> SamplingParams:
    """The placeholder sampling parameters of a pooling request (the engine samples nothing)."""
    return SamplingParams(max_tokens=1, detokenize=False)


def pooling_request(
    processor: Any, request_id: str, prompt_token_ids: list[int], params: PoolingParams | None, priority: int = 0
) -> EngineCoreRequest:
    """The engine request of one pooling prompt, checked against ``processor``'s engine
    (``priority`` is checked by the caller, :meth:`InputProcessor.process`)."""
    if processor.runner != "pooling":
        if params is None:
            raise AssertionError("pooling_request needs PoolingParams on a generating model")
        raise ValueError(
            "this model generates text and pools nothing: embeddings need a pooling model; start the engine "
            "with --convert embed (a decoder as an embedder) or serve an embedding model (docs/pooling.md)"
        )
    if params is None:
        raise ValueError(
            "this is a pooling model (--runner pooling): it returns embeddings, not text; use LLM.embed / "
            "LLM.encode or /v1/embeddings, or start a generative model with --runner generate"
        )
    if not isinstance(params, PoolingParams):
        raise ValueError(f"pooling_params={params!r} must be a host PoolingParams")
    n = len(prompt_token_ids)
    if n == 0:
        raise ValueError("the prompt is empty; send at least one token")
    if n > processor.max_model_len:
        raise ValueError(
            f"the prompt has {n} tokens, more than max_model_len={processor.max_model_len}; "
            "shorten the prompt or raise --max-model-len (up to the model's max_position_embeddings)"
        )
    if n > processor.max_num_batched_tokens:
        raise ValueError(
            f"the prompt has {n} tokens, more than one step's budget max_num_batched_tokens="
            f"{processor.max_num_batched_tokens} (a pooling prompt runs in one step); shorten it or raise "
            "--max-num-batched-tokens"
        )
    processor._check_vocab(prompt_token_ids, "the prompt")
    params.verify(int(processor.hf_config.hidden_size))
    request = EngineCoreRequest(
        request_id, list(prompt_token_ids), _one_step_params(), processor.eos_token_id, time.time(), priority
    )
    request.pooling_params = params.clone()
    return request


def to_pooling_output(result: Any) -> PoolingRequestOutput:
    """A finished :class:`RequestOutput` of a pooling request as a :class:`PoolingRequestOutput`;
    one that ended without a vector (aborted) is a ``ValueError``."""
    vector = getattr(result, "pooling_output", None)
    if vector is None:
        reasons = [c.finish_reason for c in result.outputs]
        raise ValueError(f"request {result.request_id} ended without a pooled vector (finish reasons {reasons})")
    return PoolingRequestOutput(result.request_id, list(result.prompt_token_ids), PoolingOutput(vector), True, result.prompt)


def _per_prompt_params(pooling_params: PoolingParams | Sequence[PoolingParams] | None, n: int) -> list[PoolingParams]:
    if pooling_params is None:
        return [PoolingParams() for _ in range(n)]
    if isinstance(pooling_params, PoolingParams):
        return [pooling_params] * n
    params = list(pooling_params)
    if len(params) != n:
        raise ValueError(f"got {len(params)} pooling_params for {n} prompts; pass one, or one per prompt")
    return params


def encode_offline(llm: Any, prompts: Any, pooling_params: Any = None) -> list[PoolingRequestOutput]:
    """``LLM.encode``: pool every prompt (batched by the scheduler); outputs in prompt order."""
    from host.core.frontend.output_processor import OutputProcessor

    items = llm.input_processor.normalize_prompts(prompts)
    params_list = _per_prompt_params(pooling_params, len(items))
    processor = OutputProcessor(llm.tokenizer)
    results, sent = [], []
    try:
        for (text, ids), params in zip(items, params_list):
            request = llm.input_processor.process(llm.next_request_id(), ids, _one_step_params(), pooling_params=params)
            result, engine_requests = processor.add_request(request, text)
            results.append(result)
            for engine_request in engine_requests:
                llm.engine_core.add_request(engine_request)
                sent.append(engine_request.request_id)
        while processor.has_unfinished_requests():
            llm._step(processor)
    except BaseException:
        llm.engine_core.abort_requests(sent)  # no blocks left behind
        raise
    return [to_pooling_output(r) for r in results]


def embed_offline(llm: Any, prompts: Any, pooling_params: Any = None) -> list[EmbeddingRequestOutput]:
    """``LLM.embed``: :func:`encode_offline` with ``task="embed"``, as ``.outputs.embedding``."""
    if pooling_params is None:
        pooling_params = PoolingParams(task="embed")
    return [EmbeddingRequestOutput.from_pooling(out) for out in encode_offline(llm, prompts, pooling_params)]


async def encode_async(
    llm: Any, prompt: Any, pooling_params: PoolingParams | None, request_id: str | None = None, **kwargs: Any
) -> AsyncIterator[PoolingRequestOutput]:
    """``AsyncLLM.encode``: ``prompt`` as token ids, a string, or ``{"prompt_token_ids": [...]}``;
    yields one finished :class:`PoolingRequestOutput`. Cancelling it aborts the request."""
    text = None
    if isinstance(prompt, (str, dict)):
        ((text, ids),) = llm.input_processor.normalize_prompts(prompt)
    else:
        ids = list(prompt)
    params = pooling_params if pooling_params is not None else PoolingParams()
    result = None
    async for result in llm.generate(ids, _one_step_params(), request_id, text, pooling_params=params, **kwargs):
        pass
    if result is not None:
        yield to_pooling_output(result)
