"""Everything an engine needs, one config per concern."""

from __future__ import annotations

from dataclasses import dataclass, field

from host.core.config.cache import CacheConfig
from host.core.config.compilation import CompilationConfig
from host.core.config.kv_transfer import KVTransferConfig
from host.core.config.load import LoadConfig
from host.core.config.lora import LoRAConfig
from host.core.config.model import ModelConfig
from host.core.config.parallel import ParallelConfig
from host.core.config.quantization import QuantizationConfig
from host.core.config.scheduler import SchedulerConfig
from host.core.config.speculative import SpeculativeConfig


@dataclass
class EngineConfig:
    """Everything an engine needs; built once from :class:`EngineArgs` or keyword arguments."""

    model: ModelConfig = field(default_factory=ModelConfig)
    load: LoadConfig = field(default_factory=LoadConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    quant: QuantizationConfig = field(default_factory=QuantizationConfig)
    attention_backend: str | None = None
    device: str = "auto"
    # the -O level and the flags that override it (resolved by the platform at start-up)
    compilation: CompilationConfig = field(default_factory=CompilationConfig)
    # --kv-transfer-config: the KV connector, or None (docs/kv_transfer.md)
    kv_transfer: KVTransferConfig | None = None
    # --speculative-config: speculative decoding, or None (docs/speculative.md)
    speculative: SpeculativeConfig | None = None
    # --enable-lora: adapters per step, rank, CPU tier; None: LoRA off (docs/lora.md)
    lora: LoRAConfig | None = None

    @property
    def optimization_level(self) -> int:
        return self.compilation.level

    @property
    def dtype(self) -> str:
        return self.model.dtype
