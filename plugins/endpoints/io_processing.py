"""IO processors around the engine (the ``host.io_processors`` registry), for ``POST /pooling``.

Which processor a request gets: the request's ``"io_processor"`` name, else ``host serve
--io-processor NAME``, else the model's ``config.json`` key ``io_processor_plugin``, else none
(a plain pooling request). A configured name that no plugin registered fails the start with a
``ValueError`` listing the registered ones; a request naming one is a 400 listing them.

A request runs ``parse_data`` (a ``ValueError`` is a 400 naming ``data``) -> ``pre_process``
(one prompt or several: texts, token ids, or ``{"prompt": ...}`` / ``{"prompt_token_ids": ...}``)
-> the engine (``AsyncLLM.encode`` with ``merge_pooling_params`` on a pooling model,
``generate`` with ``merge_sampling_params`` on a generative one; a processor whose ``runner``
is the other one is a 400 naming the flag) -> ``post_process`` over the outputs in prompt order.
Each processor is built once per server with the engine's config and tokenizer.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import Request

from host.plugins.endpoints.common import encode_text, off_loop, run_to_end
from host.plugins.endpoints.openai_common import gather_all_or_cancel
from host.sdk import APIError


def registered() -> dict[str, Any]:
    from host.sdk.runtime import get_plugin_host

    return get_plugin_host().registry("io_processors")


def default_name(settings: Any, config: Any) -> str | None:
    """``--io-processor``, else the model config's ``io_processor_plugin``, else ``None``."""
    name = getattr(settings, "io_processor", None)
    if name:
        return name
    hf = getattr(getattr(config, "model", None), "hf_config", None)
    return getattr(hf, "io_processor_plugin", None) or None


def check_name(name: str, where: str) -> None:
    """``ValueError`` when no plugin registered ``name`` (``where`` says who asked for it)."""
    names = registered()
    if name not in names:
        listed = ", ".join(sorted(names)) or "none"
        raise ValueError(f"{where} asks for the IO processor {name!r}, which no plugin registered; registered: {listed} "
                         "(install the plugin that provides it, or pick one of these)")


class IOProcessors:
    """This server's processors: the default name and one instance per name used."""

    def __init__(self, settings: Any, config: Any) -> None:
        self.default = default_name(settings, config)
        if self.default is not None:
            where = "--io-processor" if getattr(settings, "io_processor", None) else "the model's config.json (io_processor_plugin)"
            check_name(self.default, where)
        self._made: dict[str, Any] = {}

    def pick(self, requested: str | None) -> str | None:
        """The name of the processor a request uses (``None``: none); a 400 for an unknown one."""
        name = requested or self.default
        if name is not None and name not in self._made:
            try:
                check_name(name, "the request's io_processor")
            except ValueError as exc:
                raise APIError(400, str(exc), param="io_processor") from None
        return name

    def instance(self, name: str, engine: Any, config: Any) -> Any:
        """The processor ``name``, built once with the engine's config and tokenizer."""
        if name not in self._made:
            self._made[name] = registered()[name](config, engine.tokenizer)
        return self._made[name]


def _prompt_ids(prompt: Any, tokenizer: Any) -> list[int]:
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            prompt = prompt["prompt_token_ids"]
        elif "prompt" in prompt:
            prompt = prompt["prompt"]
    if isinstance(prompt, str) and prompt:
        return encode_text(tokenizer, prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    raise ValueError(f"the IO processor's pre_process made the prompt {prompt!r}; a prompt is a non-empty string, "
                     "token ids, or {'prompt': ...} / {'prompt_token_ids': [...]}")


def _prompts(made: Any, tokenizer: Any) -> list[list[int]]:
    if isinstance(made, (list, tuple)) and made and not all(isinstance(t, int) for t in made):
        return [_prompt_ids(p, tokenizer) for p in made]
    return [_prompt_ids(made, tokenizer)]


async def run_processor(raw: Request, processors: IOProcessors, name: str, data: Any, pooling: bool) -> dict[str, Any]:
    """One request through the processor ``name`` and the engine; the body of the response:
    ``{"request_id", "created_at", "data": <post_process's result>}`` (vLLM's IOProcessorResponse)."""
    state = raw.app.state
    engine = state.engine
    proc = processors.instance(name, engine, state.config)
    runner = "pooling" if pooling else "generate"
    if proc.runner is not None and proc.runner != runner:
        flag = "--runner pooling (an embedding model, or --convert embed)" if proc.runner == "pooling" else "--runner generate"
        raise APIError(400, f"the IO processor {proc.name!r} needs a {proc.runner} model; this server runs a {runner} "
                       f"model (serve one with {flag})", param="io_processor")
    try:
        parsed = proc.parse_data(data)
    except ValueError as exc:
        raise APIError(400, str(exc), param="data") from None
    request_id = f"io-{uuid.uuid4().hex}"
    created = int(time.time())
    try:
        made = await proc.pre_process_async(parsed, request_id=request_id)
        prompts = await off_loop(_prompts, made, engine.tokenizer)
        params = proc.merge_pooling_params(None, parsed) if pooling else proc.merge_sampling_params(None, parsed)
        engine.admit()

        async def one(i: int, ids: list[int]) -> Any:
            rid = f"{request_id}-{i}"
            try:
                gen = engine.encode(ids, params, request_id=rid) if pooling else engine.generate(ids, params, request_id=rid)
                return await run_to_end(raw, gen)
            except ValueError as exc:
                raise APIError(400, f"prompt {i} of the IO processor {proc.name!r}: {exc}", param="data") from None

        outputs = await gather_all_or_cancel([one(i, ids) for i, ids in enumerate(prompts)])
        result = await proc.post_process_async(outputs, request_id=request_id)
    except ValueError as exc:
        raise APIError(400, str(exc), param="data") from None
    finally:
        discard = getattr(proc, "discard", None)
        if discard is not None:
            discard(request_id)
    return {"request_id": request_id, "created_at": created, "data": result}
