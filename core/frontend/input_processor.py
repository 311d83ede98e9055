"""The front end's input processor: every prompt and parameter check, once, before the engine.

Both front ends (the offline :class:`~host.core.frontend.llm.LLM` and the API server's
:class:`~host.core.frontend.async_llm.AsyncLLM`) turn a prompt and its
:class:`SamplingParams` into an :class:`EngineCoreRequest` here. A bad value raises
``ValueError`` naming it and the fix (the API server answers HTTP 400), so the engine core only
sees requests it can run. What only the engine knows (the KV cache's size, whether a grammar
compiles) is checked there.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Sequence

from host.contracts.messages import EngineCoreRequest
from host.contracts.sampling_params import MAX_LOGPROBS, SamplingParams, check_int


def prepare_params(tokenizer: Any | None, params: SamplingParams) -> SamplingParams:
    """Front-end preparation of a request's params: ``bad_words`` become token id sequences
    (each word with and without a leading space, as a word inside a sentence is tokenized
    differently). Returns a copy when something changed."""
    if not params.bad_words:
        return params
    if tokenizer is None:
        raise ValueError("bad_words needs a tokenizer; this engine was built with skip_tokenizer_init=True")
    params = copy.copy(params)
    seqs: list[list[int]] = []
    for word in params.bad_words:
        for variant in (word, " " + word.lstrip()):
            ids = tokenizer.encode(variant, add_special_tokens=False)
            if ids and ids not in seqs:
                seqs.append(ids)
    params.bad_words_token_ids = seqs
    return params


def check_priority(priority: object) -> int:
    """A request's scheduling priority (lower runs first under ``--scheduling-policy priority``)
    as a 64-bit integer, or ``ValueError`` naming ``priority`` and the range."""
    return check_int("priority", priority)


def _is_dir(path: str) -> bool:
    import os

    return os.path.isdir(os.path.expanduser(path))


class InputProcessor:
    """Validates and prepares requests for one engine configuration and tokenizer."""

    def __init__(self, config: Any, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer
        self.max_model_len: int = config.model.max_model_len
        self.vocab_size: int = config.model.hf_config.vocab_size
        self.max_num_seqs: int = config.scheduler.max_num_seqs
        # --max-logprobs; -1: no limit (the whole vocabulary may be asked for)
        self.max_logprobs: int = getattr(config.model, "max_logprobs", MAX_LOGPROBS)
        self.lora_config = getattr(config, "lora", None)  # --enable-lora, else None
        # "pooling": prompts are pooled into vectors, never generated from (frontend/pooling.py)
        self.runner: str = getattr(config.model, "runner", "generate")
        self.max_num_batched_tokens: int = config.scheduler.max_num_batched_tokens
        self.hf_config = config.model.hf_config
        self._validated_adapters: dict[tuple[str, str], str] = {}
        if tokenizer is not None:
            self.eos_token_id: int | None = tokenizer.eos_token_id
        else:
            eos = getattr(config.model.hf_config, "eos_token_id", None)
            self.eos_token_id = eos[0] if isinstance(eos, list) and eos else eos

    # -- offline prompt shapes ----------------------------------------------------------------
    def normalize_prompts(self, prompts: Any) -> list[tuple[str | None, list[int]]]:
        """``"text"``, ``{"prompt": text}``, ``{"prompt_token_ids": [...]}`` or a list of them
        -> ``(text or None, token ids)`` per prompt, in order."""
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
        for i, (_, ids) in enumerate(out):
            if not ids:
                raise ValueError(f"prompts[{i}]: the decoder prompt cannot be empty; give at least one token")
            self._check_vocab(ids, f"prompts[{i}]")
        return out

    def _encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("this LLM was built with skip_tokenizer_init=True; pass {'prompt_token_ids': [...]}")
        return self.tokenizer.encode(text)

    def _check_vocab(self, ids: list[int], what: str) -> None:
        bad = [(i, t) for i, t in enumerate(ids) if not 0 <= t < self.vocab_size]
        if bad:
            shown = ", ".join(f"{t} at position {i}" for i, t in bad[:10])
            more = f" (and {len(bad) - 10} more)" if len(bad) > 10 else ""
            raise ValueError(
                f"{what} has token ids out of vocabulary (the vocabulary is [0, {self.vocab_size})): {shown}{more}; "
                "send ids this model's tokenizer produces"
            )

    # -- one request ----------------------------------------------------------------------------
    def check_prompt_length(self, n: int, *, whole_request_fits: bool = False) -> None:
        """Raise ``ValueError`` for a prompt of ``n`` tokens the engine would refuse for its length
        alone (the first check of :meth:`validate`; the API server calls it with the count of a
        large text before converting its ids to Python)."""
        max_len = self.max_model_len
        if n == 0:
            raise ValueError("the decoder prompt cannot be empty; send at least one token")
        if whole_request_fits and n >= max_len:
            raise ValueError(
                f"the prompt has {n} tokens but this server's max_model_len is {max_len}; "
                "shorten the prompt (one position must remain for the output)"
            )
        if not whole_request_fits and n > max_len:
            raise ValueError(
                f"the prompt has {n} tokens, more than max_model_len={max_len}; "
                "shorten the prompt or raise --max-model-len"
            )

    def validate(self, prompt_token_ids: list[int], params: SamplingParams, *, whole_request_fits: bool = False) -> None:
        """Raise ``ValueError`` for what the engine would refuse or cannot run.

        ``whole_request_fits`` is the API server's admission rule (vLLM's too): the prompt must
        leave room for output, ``max_tokens`` must fit in ``max_model_len``, and the ``n``
        samples must run side by side. The offline engine instead ends an over-long output with
        finish reason ``"length"``."""
        n = len(prompt_token_ids)
        max_len = self.max_model_len
        self.check_prompt_length(n, whole_request_fits=whole_request_fits)
        if whole_request_fits:
            if params.max_tokens is not None and n + params.max_tokens > max_len:
                raise ValueError(
                    f"max_tokens={params.max_tokens} plus the prompt's {n} tokens exceeds max_model_len={max_len}; "
                    f"ask for at most {max_len - n} tokens"
                )
            if params.n > self.max_num_seqs:
                raise ValueError(
                    f"n={params.n} exceeds this server's max_num_seqs={self.max_num_seqs}; the samples run side by side"
                )
            self._check_vocab(prompt_token_ids, "the prompt")
        params.verify(self.vocab_size)
        self._check_logprobs(params)

    def _check_logprobs(self, params: SamplingParams) -> None:
        """``logprobs`` and ``prompt_logprobs`` (-1: the whole vocabulary) within
        ``--max-logprobs`` (vLLM's rule: -1 counts as the vocabulary size). Chat's
        ``top_logprobs`` arrives here as ``logprobs``."""
        limit = self.vocab_size if self.max_logprobs == -1 else self.max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            asked = getattr(params, name)
            if asked is None:
                continue
            count = self.vocab_size if asked == -1 else asked
            if count > limit:
                shown = "-1 (the whole vocabulary, " + str(self.vocab_size) + " tokens)" if asked == -1 else str(asked)
                what = "logprobs (chat: top_logprobs)" if name == "logprobs" else name
                raise ValueError(
                    f"{what}={shown} is more than this server allows: at most {limit} "
                    "(set by --max-logprobs; -1 there lifts the limit)"
                )

    def process(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        priority: int = 0,
        whole_request_fits: bool = False,
        lora_request: Any = None,
        pooling_params: Any = None,
    ) -> EngineCoreRequest:
        """The engine request for one prompt (its ``n`` samples are fanned out by the output
        processor). Prepares the params (``bad_words``) and validates everything, the LoRA
        adapter included (its digest filled, see :func:`host.core.lora.adapter.read_adapter`).
        With ``pooling_params`` (or on a pooling model) a pooling request instead
        (:func:`host.core.pooling.frontend.pooling_request`)."""
        if pooling_params is not None or self.runner == "pooling":
            from host.core.pooling.frontend import pooling_request

            if lora_request is not None:
                raise ValueError("lora_request is not supported for pooling requests; drop it")
            check_priority(priority)
            return pooling_request(self, request_id, prompt_token_ids, pooling_params, priority)
        check_priority(priority)
        params = prepare_params(self.tokenizer, params)
        self.validate(prompt_token_ids, params, whole_request_fits=whole_request_fits)
        request = EngineCoreRequest(
            request_id, list(prompt_token_ids), params, self.eos_token_id, time.time(), priority
        )
        if lora_request is not None:
            request.lora_request = self.check_lora(lora_request)
        return request

    def check_lora(self, lora_request: Any) -> Any:
        """``lora_request`` validated against this engine and model, with its digest filled; a
        ``ValueError`` naming the problem (LoRA off, a missing file, a rank too large, an
        unknown target module, a shape of another model)."""
        from host.contracts.lora_request import LoRARequest
        from host.core.lora.adapter import read_adapter

        if not isinstance(lora_request, LoRARequest):
            raise ValueError(f"lora_request={lora_request!r} must be a host.LoRARequest(name, id, path) or None")
        if self.lora_config is None:
            raise ValueError(
                f"LoRA adapter {lora_request.lora_name!r} requested, but this engine runs without LoRA; "
                "start it with --enable-lora (LLM(enable_lora=True))"
            )
        from host.core.lora.adapter import adapter_digest

        if not isinstance(lora_request.lora_path, str) or not lora_request.lora_path:
            raise ValueError(f"LoRA adapter {lora_request.lora_name!r} has no lora_path; pass its PEFT directory")
        # an adapter validated once is not read again until its files change (a new digest)
        key = (lora_request.lora_path, adapter_digest(lora_request.lora_path) if _is_dir(lora_request.lora_path) else "")
        if key not in self._validated_adapters:
            files = read_adapter(lora_request.lora_path, self.lora_config, self.hf_config)
            self._validated_adapters[key] = files.digest
        return lora_request.with_digest(self._validated_adapters[key])
