"""The offline API: ``from host import LLM, SamplingParams``.

Shaped like vLLM's so code can switch: ``LLM(model=..., **engine_args)`` takes the engine flags
as keywords; ``generate`` accepts strings or ``{"prompt_token_ids": [...]}`` and returns one
:class:`RequestOutput` per prompt, in order; ``chat`` applies the tokenizer's chat template.
The API, engine and worker roles all run in this one process.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any, Sequence

from host.core.engine_args import EngineArgs
from host.core.engine.core import EngineCore
from host.core.frontend.output_processor import CompletionOutput, Logprob, OutputProcessor, RequestOutput, prepare_params
from host.core.plugins.manager import PluginHost, get_plugin_host, set_plugin_host
from host.core.plugins.settings import PluginSettings
from host.core.scheduler.request import Request, RequestStatus
from host.core.sampling_params import SamplingParams
from host.core.models.tokenizer import get_tokenizer

logger = logging.getLogger("host.llm")

__all__ = ["LLM", "CompletionOutput", "Logprob", "RequestOutput", "SamplingParams"]


def _plugin_settings(plugins: str | None, block_plugins: str | None, strict_plugins: bool | None, platform: str | None) -> PluginHost:
    if plugins is None and block_plugins is None and strict_plugins is None and platform is None:
        return get_plugin_host()
    settings = PluginSettings.from_env(plugins=plugins, block_plugins=block_plugins, strict=strict_plugins, platform=platform)
    host = get_plugin_host()
    if host.settings != settings:
        from host.core.plugins.platform import reset_current_platform

        host = PluginHost(settings)
        set_plugin_host(host)
        reset_current_platform()
    return host


class LLM:
    """An engine in this process, for batch generation from Python."""

    def __init__(
        self,
        model: str | None = None,
        *,
        plugins: str | None = None,
        block_plugins: str | None = None,
        strict_plugins: bool | None = None,
        platform: str | None = None,
        **engine_args: Any,
    ) -> None:
        host = _plugin_settings(plugins, block_plugins, strict_plugins, platform)
        for role in ("api", "engine", "worker"):
            host.bootstrap(role)
        self.engine_args = EngineArgs.from_kwargs(model=model, **engine_args)
        self.config = self.engine_args.create_engine_config()
        # skip_tokenizer_init: token ids in, token ids out (text fields stay empty)
        self.tokenizer = None if self.engine_args.skip_tokenizer_init else get_tokenizer(self.config.model.tokenizer)
        self.engine = EngineCore(self.config)
        self._ids = itertools.count()

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    @property
    def eos_token_id(self) -> int | None:
        if self.tokenizer is not None:
            return self.tokenizer.eos_token_id
        eos = getattr(self.config.model.hf_config, "eos_token_id", None)
        return eos[0] if isinstance(eos, list) and eos else eos

    def next_request_id(self) -> str:
        return str(next(self._ids))

    def _encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("this LLM was built with skip_tokenizer_init=True; pass {'prompt_token_ids': [...]}")
        return self.tokenizer.encode(text)

    # -- inputs ------------------------------------------------------------------------------

    def _normalize_prompts(self, prompts: Any) -> list[tuple[str | None, list[int]]]:
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        if not isinstance(prompts, Sequence) or len(prompts) == 0:
            raise ValueError("prompts must be a non-empty string, dict or list of them")
        out: list[tuple[str | None, list[int]]] = []
        for i, p in enumerate(prompts):
            if isinstance(p, str):
                out.append((p, self._encode(p)))
            elif isinstance(p, dict) and "prompt_token_ids" in p:
                ids = list(p["prompt_token_ids"])
                if not all(isinstance(t, int) for t in ids):
                    raise ValueError(f"prompts[{i}]['prompt_token_ids'] must be a list of ints")
                out.append((p.get("prompt"), ids))
            elif isinstance(p, dict) and "prompt" in p:
                out.append((p["prompt"], self._encode(p["prompt"])))
            else:
                raise ValueError(
                    f"prompts[{i}] must be a string, {{'prompt': str}} or {{'prompt_token_ids': [...]}}, "
                    f"got {type(p).__name__}"
                )
        vocab = self.config.model.hf_config.vocab_size
        for i, (_, ids) in enumerate(out):
            if not ids:
                raise ValueError(f"prompts[{i}] is empty; give at least one token")
            bad = [t for t in ids if t < 0 or t >= vocab]
            if bad:
                raise ValueError(f"prompts[{i}] has token ids outside the vocabulary [0, {vocab}): {bad[:5]}")
        return out

    # -- generation --------------------------------------------------------------------------

    def generate(
        self,
        prompts: Any,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (batched by the scheduler); outputs in prompt order.

        ``priority`` (one int per prompt, lower is served first) applies with
        ``scheduling_policy="priority"``.
        """
        items = self._normalize_prompts(prompts)
        if priority is not None and len(priority) != len(items):
            raise ValueError(f"got {len(priority)} priorities for {len(items)} prompts; pass one per prompt")
        priorities = list(priority) if priority is not None else [0] * len(items)
        if sampling_params is None:
            params_list = [SamplingParams() for _ in items]
        elif isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(items)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(items):
                raise ValueError(
                    f"got {len(params_list)} sampling_params for {len(items)} prompts; pass one, or one per prompt"
                )
        processor = OutputProcessor(self.tokenizer)
        results: list[RequestOutput] = []
        engine_ids: list[str] = []
        self.last_finish_order: list[str] = []
        try:
            for (text, ids), params, prio in zip(items, params_list, priorities):
                req_id = self.next_request_id()
                params = prepare_params(self.tokenizer, params)
                children = [params] if params.n == 1 else [params.clone_for_sample(i) for i in range(params.n)]
                child_ids = [req_id] if params.n == 1 else [f"{req_id}-{i}" for i in range(params.n)]
                results.append(processor.add_request(req_id, text, ids, params, child_ids, children))
                for cid, cparams in zip(child_ids, children):
                    self.engine.add_request(Request(cid, ids, cparams, eos_token_id=self.eos_token_id, priority=prio))
                    engine_ids.append(cid)
            self._run(processor)
        except BaseException:
            # never leave blocks behind: abort whatever this call added and has not finished
            self.engine.abort_requests([r for r in engine_ids if r in self.engine.scheduler.requests])
            raise
        return results

    def _run(self, processor: OutputProcessor) -> None:
        while self.engine.has_unfinished_requests():
            step = self.engine.step()
            stopped: list[str] = []
            for out in step.outputs:
                if not processor.has(out.req_id):
                    continue
                if out.error is not None:
                    raise ValueError(f"request {out.req_id}: {out.error}")
                _, stop_str = processor.process(out)
                if stop_str is not None and not out.finished:
                    stopped.append(out.req_id)
                if out.finished or stop_str is not None:
                    self.last_finish_order.append(out.req_id)
            if stopped:
                self.engine.finish_requests(stopped, RequestStatus.FINISHED_STOPPED)

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Apply the tokenizer's chat template to one conversation (or a list) and generate."""
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        prompts = []
        for conv in conversations:
            text = self.tokenizer.apply_chat_template(
                conv, tokenize=False, add_generation_prompt=add_generation_prompt, **(chat_template_kwargs or {})
            )
            prompts.append({"prompt": text, "prompt_token_ids": self.tokenizer.encode(text, add_special_tokens=False)})
        return self.generate(prompts, sampling_params)

    def stats(self) -> Any:
        return self.engine.scheduler.make_stats()

    def shutdown(self) -> None:
        self.engine.shutdown()
