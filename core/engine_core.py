"""The engine core: scheduler + KV cache manager + executor, advanced one step at a time.

This is what the engine-core process runs; the offline :class:`host.LLM` drives it in-process.
"""

from __future__ import annotations

import logging
from typing import Iterable

from host.core.config import EngineConfig
from host.core.kv_cache.manager import KVCacheManager
from host.core.kv_cache.spec import KVCacheConfig, num_blocks_from_memory
from host.core.outputs import EngineCoreOutputs, ModelRunnerOutput
from host.core.plugins.manager import get_plugin_host
from host.core.request import Request, RequestStatus
from host.core.scheduler.scheduler import Scheduler

logger = logging.getLogger("host.engine")


class EngineCore:
    """Owns one model replica: sizes the KV cache, schedules and executes steps."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        executors = get_plugin_host().registry("executors")
        name = config.parallel.distributed_executor_backend
        if name not in executors:
            raise ValueError(
                f"distributed_executor_backend={name!r} is not registered; registered executors: "
                f"{', '.join(sorted(executors)) or 'none'}"
            )
        self.executor = executors[name](config)
        specs = self.executor.collective_rpc("get_kv_cache_specs")[0]
        cache = config.cache
        if cache.num_gpu_blocks_override is not None:
            num_blocks = cache.num_gpu_blocks_override
            source = "num_gpu_blocks_override"
        else:
            available = self.executor.determine_available_memory()
            num_blocks = num_blocks_from_memory(available, specs, config.scheduler.max_model_len)
            source = f"a KV budget of {available / 2**20:.1f} MiB"
        self.kv_cache_config = KVCacheConfig(num_blocks, cache.block_size, specs)
        cache.num_gpu_blocks = num_blocks
        self.executor.collective_rpc("initialize_kv_cache", (num_blocks,))
        logger.info(
            "KV cache: %d blocks x %d tokens (%d tokens, %.1f MiB) from %s",
            num_blocks,
            cache.block_size,
            (num_blocks - 1) * cache.block_size,
            self.kv_cache_config.kv_cache_bytes / 2**20,
            source,
        )
        self.kv_cache_manager = KVCacheManager(
            self.kv_cache_config,
            enable_caching=cache.enable_prefix_caching,
            max_model_len=config.scheduler.max_model_len,
        )
        self.scheduler = Scheduler(config.scheduler, cache, self.kv_cache_manager)

    def add_request(self, request: Request) -> None:
        """Queue a request; its sampling params are checked against the model first (token ids
        inside the vocabulary), so a bad request is a ``ValueError`` and never reaches a step."""
        request.sampling_params.verify(self.config.model.hf_config.vocab_size)
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        self.scheduler.finish_requests(list(request_ids), RequestStatus.FINISHED_ABORTED)

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> None:
        self.scheduler.finish_requests(list(request_ids), status)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> EngineCoreOutputs:
        """Schedule, execute and update once; returns the new tokens of every request."""
        scheduler_output = self.scheduler.schedule()
        if scheduler_output.total_num_scheduled_tokens == 0:
            empty = ModelRunnerOutput(req_ids=[], req_id_to_index={}, sampled_token_ids=[])
            return self.scheduler.update_from_output(scheduler_output, empty)
        runner_output = self.executor.execute_model(scheduler_output)
        return self.scheduler.update_from_output(scheduler_output, runner_output)

    def shutdown(self) -> None:
        self.executor.shutdown()
