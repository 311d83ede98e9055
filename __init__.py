"""host: an LLM inference and serving engine whose hardware and features are plugins."""

from typing import Any

__version__ = "0.1.0"

__all__ = [
    "LLM", "EmbeddingRequestOutput", "LoRARequest", "PoolingParams", "PoolingRequestOutput", "SamplingParams", "__version__",
]


def __getattr__(name: str) -> Any:
    # the offline API is imported on first use so `import host` stays light for plugin authors
    if name == "LLM":
        from host.core.frontend.llm import LLM

        return LLM
    if name == "LoRARequest":
        from host.contracts.lora_request import LoRARequest

        return LoRARequest
    if name == "PoolingParams":
        from host.contracts.pooling_params import PoolingParams

        return PoolingParams
    if name in ("PoolingRequestOutput", "EmbeddingRequestOutput"):
        from host.core.frontend import pooling_output

        return getattr(pooling_output, name)
    if name == "SamplingParams":
        from host.contracts.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'host' has no attribute {name!r}")
