"""The worker: one device, its model runner, and its share of the KV cache."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from host.core.config import EngineConfig
from host.core.model_runner import ModelRunner
from host.core.outputs import ModelRunnerOutput, SchedulerOutput

logger = logging.getLogger("host.worker")

CPU_DEFAULT_KV_BYTES = 2 * 2**30


class Worker:
    """Runs on one device: loads the model, sizes and owns the KV cache, executes steps."""

    def __init__(self, config: EngineConfig, rank: int = 0, local_rank: int = 0, platform: Any = None) -> None:
        self.config = config
        self.rank = rank
        self.local_rank = local_rank
        self.platform = platform
        self.device: torch.device | None = None
        self.model_runner: ModelRunner | None = None

    def init_device(self) -> None:
        if self.platform.device_type == "cpu":
            self.device = torch.device("cpu")
        else:
            visible = self.platform.logical_device_id_to_visible_device_id(self.local_rank)
            self.device = torch.device(self.platform.device_type, visible)
            getattr(torch, self.platform.device_type).set_device(self.device)
        torch.manual_seed(self.config.model.seed)
        self.model_runner = ModelRunner(self.config, self.device, self.platform)

    def load_model(self) -> None:
        assert self.model_runner is not None
        self.model_runner.load_model()

    def get_kv_cache_specs(self) -> list[Any]:
        assert self.model_runner is not None
        return self.model_runner.get_kv_cache_specs()

    def determine_available_memory(self) -> int:
        """Bytes this worker can give to the KV cache.

        ``--kv-cache-memory`` wins. Otherwise on CPU: ``gpu_memory_utilization`` of physical
        RAM minus the weights, capped at 2 GiB by default (a CPU has no dedicated memory to
        fill) and at twice what ``max_num_seqs`` full-length sequences need. On an accelerator: ``gpu_memory_utilization`` of device memory minus what is
        in use after loading the model, plus a margin for activations.
        """
        cache = self.config.cache
        if cache.kv_cache_memory is not None:
            return int(cache.kv_cache_memory)
        assert self.model_runner is not None
        weights = self.model_runner.model_memory_bytes()
        if self.device.type == "cpu":
            total = self.platform.get_device_total_memory()
            budget = int(total * cache.gpu_memory_utilization) - weights
            # no point holding more than every sequence slot filled to max_model_len (plus the
            # same again for prefix-cache reuse): a tiny model would otherwise get 2 GiB
            runner = self.model_runner
            token_bytes = 2 * runner.num_layers * runner.num_kv_heads * runner.head_size * runner.dtype.itemsize
            useful = 2 * self.config.scheduler.max_num_seqs * self.config.scheduler.max_model_len * token_bytes
            return max(0, min(budget, CPU_DEFAULT_KV_BYTES, useful))
        mod = getattr(torch, self.device.type)
        mod.synchronize()
        free, total = mod.mem_get_info(self.device)
        used = total - free
        activation_margin = int(0.05 * total)
        return max(0, int(total * cache.gpu_memory_utilization) - used - activation_margin)

    def initialize_kv_cache(self, num_blocks: int) -> None:
        assert self.model_runner is not None
        self.model_runner.initialize_kv_cache(num_blocks)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        assert self.model_runner is not None
        return self.model_runner.execute_model(scheduler_output)

    def shutdown(self) -> None:
        self.model_runner = None
