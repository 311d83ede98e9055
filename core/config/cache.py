"""Paged KV cache sizing."""

from __future__ import annotations

from dataclasses import dataclass

from host.core.config.common import KV_CACHE_DTYPES


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
    # one KV cache group even for layers of several kinds (sliding windows allocated like full
    # attention): --disable-hybrid-kv-cache-manager
    disable_hybrid_kv_cache_manager: bool = False
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
        if self.cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype={self.cache_dtype!r} is not supported; use one of {', '.join(KV_CACHE_DTYPES)} "
                "(auto: the model dtype; fp8 = fp8_e4m3: float8_e4m3fn pages)"
            )
