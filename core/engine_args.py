"""Engine arguments: the flat set of user flags (CLI ``--max-num-seqs`` = keyword
``max_num_seqs``) and their resolution into an :class:`EngineConfig`."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from host.core.config import CacheConfig, CompilationConfig, EngineConfig, LoadConfig, ModelConfig, ParallelConfig, SchedulerConfig

logger = logging.getLogger("host.engine")


@dataclass
class EngineArgs:
    """Every engine flag, with the defaults ``host generate`` / ``LLM(...)`` use."""

    model: str | None = None
    tokenizer: str | None = None
    skip_tokenizer_init: bool = False
    dtype: str = "auto"
    max_model_len: int | None = None
    seed: int = 0
    served_model_name: str | None = None
    load_format: str = "auto"
    block_size: int = 16
    enable_prefix_caching: bool = True
    kv_cache_memory: int | None = None
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
    max_num_seqs: int = 128
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    scheduling_policy: str = "fcfs"
    attention_backend: str | None = None
    distributed_executor_backend: str = "uniproc"
    optimization_level: int = 2
    enforce_eager: bool = False
    custom_ops: bool | None = None
    torch_compile: bool | None = None
    cuda_graphs: bool | None = None
    cuda_graph_sizes: list[int] | None = None
    async_scheduling: bool | None = None  # None: on where the device runs asynchronously (not the CPU)

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "EngineArgs":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise ValueError(
                f"unknown engine argument(s) {', '.join(unknown)}; valid ones are: {', '.join(sorted(names))}"
            )
        return cls(**kwargs)

    def create_engine_config(self) -> EngineConfig:
        """Resolve the model (path, config, dtype, context length) on the current platform."""
        from host.core.models.default_model import resolve_model_path
        from host.core.models.loader import get_model_architecture, load_hf_config, max_model_len, resolve_dtype
        from host.core.plugins.manager import get_plugin_host
        from host.core.plugins.platform import current_platform

        platform = current_platform()
        if platform.name == "unspecified":
            raise RuntimeError("no platform detected this machine's hardware; see `host platform`")
        path = resolve_model_path(self.model)
        hf_config = load_hf_config(path)
        dtype = str(resolve_dtype(self.dtype, hf_config, platform.device_type)).replace("torch.", "")
        model_max = max_model_len(hf_config)
        if self.max_model_len is not None and self.max_model_len > model_max:
            raise ValueError(
                f"max_model_len={self.max_model_len} exceeds the model's limit of {model_max} "
                f"(max_position_embeddings); use --max-model-len {model_max} or less"
            )
        ctx_len = self.max_model_len or min(model_max, 8192)
        batched = self.max_num_batched_tokens
        if batched is None:
            batched = 2048 if self.enable_chunked_prefill else max(ctx_len, 2048)
        if not self.enable_chunked_prefill and batched < ctx_len:
            raise ValueError(
                f"max_num_batched_tokens={batched} is smaller than max_model_len={ctx_len} with chunked "
                "prefill off, so long prompts could never be scheduled; raise --max-num-batched-tokens "
                "or enable chunked prefill"
            )
        model_cfg = ModelConfig(
            model=path,
            tokenizer=self.tokenizer or path,
            dtype=dtype,
            max_model_len=ctx_len,
            seed=self.seed,
            served_model_name=self.served_model_name,
            hf_config=hf_config,
            architecture=get_model_architecture(hf_config),
            resolved_path=path,
        )
        config = EngineConfig(
            model=model_cfg,
            load=LoadConfig(self.load_format),
            cache=CacheConfig(
                block_size=self.block_size,
                enable_prefix_caching=self.enable_prefix_caching,
                kv_cache_memory=self.kv_cache_memory,
                gpu_memory_utilization=self.gpu_memory_utilization,
                num_gpu_blocks_override=self.num_gpu_blocks_override,
            ),
            scheduler=SchedulerConfig(
                max_num_seqs=self.max_num_seqs,
                max_num_batched_tokens=batched,
                max_model_len=ctx_len,
                enable_chunked_prefill=self.enable_chunked_prefill,
                long_prefill_token_threshold=self.long_prefill_token_threshold,
                policy=self.scheduling_policy,
                async_scheduling=self.async_scheduling if self.async_scheduling is not None else platform.device_type != "cpu",
            ),
            parallel=ParallelConfig(distributed_executor_backend=self.distributed_executor_backend),
            attention_backend=self.attention_backend,
            device=platform.device_type,
            compilation=CompilationConfig(
                level=self.optimization_level,
                custom_ops=self.custom_ops,
                torch_compile=self.torch_compile,
                cuda_graphs=self.cuda_graphs,
                cuda_graph_sizes=self.cuda_graph_sizes,
                enforce_eager=self.enforce_eager,
            ),
        )
        host = get_plugin_host()
        host.call_each("host_adjust_config", config=config)
        config.compilation.resolve(config.scheduler.max_num_seqs, platform.can_capture_graphs())
        platform.check_and_update_config(config)
        logger.info("compilation: %s", config.compilation.describe())
        return config
