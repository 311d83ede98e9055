"""The built-in features' seams, as an engine's configs turn them on (see feature.py)."""

from __future__ import annotations

from typing import Any

from host.core.kv_cache.manager import KVCacheManager
from host.core.kv_transfer.scheduler import KVTransferFeature
from host.core.lora.scheduler import LoRAFeature
from host.core.moe.eplb.scheduler import EPLBFeature
from host.core.pooling.scheduler import PoolingFeature
from host.core.scheduler.feature import SchedulerFeature
from host.core.spec_decode.scheduler import SpecDecodeFeature
from host.core.structured_output.scheduler import StructuredOutputFeature


def default_features(
    kv: KVCacheManager, max_model_len: int, kv_connector: Any = None, kv_transfer_config: Any = None,
    steps_in_flight: bool = False, lora_config: Any = None, speculative_config: Any = None, eplb: bool = False,
) -> list[SchedulerFeature]:
    """The built-in features an engine's configs turn on, in the order their seams are called
    (drafts before grammars take the tokens; grammars, then adapters, then remote loads admit)."""
    features: list[SchedulerFeature] = []
    if speculative_config is not None:  # --speculative-config: drafts, rollback, acceptance counts
        features.append(SpecDecodeFeature(speculative_config, max_model_len))
    features.append(StructuredOutputFeature())
    if lora_config is not None:  # --enable-lora: at most max_loras adapters among the running requests
        features.append(LoRAFeature(lora_config.max_loras))
    if kv_connector is not None:  # --kv-transfer-config; with steps in flight, frees wait for them
        features.append(KVTransferFeature(kv_connector, kv_transfer_config, kv, steps_in_flight))
    features.append(PoolingFeature())
    if eplb:  # --enable-eplb: the workers' balancedness and rearrangements, for metrics
        features.append(EPLBFeature())
    return features
