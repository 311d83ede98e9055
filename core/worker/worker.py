"""The worker: one device, its model runner, and its share of the KV cache."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from host.contracts.scheduler_output import SchedulerOutput
from host.core.config import EngineConfig
from host.core.worker.model_runner import ModelRunner
from host.core.worker.sampling_step import SamplingStep
from host.core.worker.step_kind import StepKind

logger = logging.getLogger("host.worker")

CPU_DEFAULT_KV_BYTES = 2 * 2**30
# set aside for the decode graphs' memory pool, captured after the KV cache is allocated
GRAPH_MEMORY_RESERVE = 512 * 2**20
WARM_UP_TOKENS = 16
"""Tokens of the warm-up step where no profiling run happened (:meth:`Worker.initialize_kv_cache`):
more than the small-batch kernels' rows, so the batched linears run once as well."""


def make_step_kind(runner: ModelRunner) -> StepKind:
    """The step kind of ``runner``'s config (:mod:`host.core.worker.step_kind`): the speculative
    verify step with ``--speculative-config`` (docs/speculative.md), the pooling step for a
    pooling model (docs/pooling.md), else the plain sampling step. The runner calls this from
    ``load_model``, once the target model is loaded."""
    config = runner.config
    if getattr(config, "speculative", None) is not None:
        from host.core.spec_decode.worker.verify import SpecDecodeStep

        return SpecDecodeStep(runner)
    if config.model.runner == "pooling":  # pool prompts instead of sampling tokens
        from host.core.pooling.worker import PoolingRunner

        return PoolingRunner(runner)
    return SamplingStep(runner)


def kv_budget(total: int, utilization: float, peak: int, non_torch: int, reserve: int = 0) -> int:
    """Bytes left for the KV cache: ``utilization`` of the device, minus the profiled peak of
    torch allocations (weights and the largest step's activations), minus memory outside
    torch's allocator, minus a reserve for graphs. Never negative."""
    return max(0, int(total * utilization) - peak - non_torch - reserve)


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
        parallel = self.config.parallel
        if self.platform.device_type == "cpu":
            self.device = torch.device("cpu")
        else:
            # -dp N: engine i's ranks use the devices after engines 0..i-1's (a Ray actor sees only
            # the device Ray gave it: its local rank is 0 whatever its engine)
            offset = 0 if parallel.distributed_executor_backend == "ray" else parallel.data_parallel_rank * parallel.world_size
            device_index = offset + self.local_rank
            visible = self.platform.logical_device_id_to_visible_device_id(device_index)
            count = getattr(torch, self.platform.device_type).device_count()
            if visible >= count:
                raise RuntimeError(
                    f"-dp {parallel.data_parallel_size} x -tp {parallel.tensor_parallel_size} x -pp "
                    f"{parallel.pipeline_parallel_size} needs {parallel.data_parallel_size * parallel.world_size} "
                    f"{self.platform.device_type} devices; this process sees {count} (device {visible} is missing): "
                    "lower the sizes or make more devices visible"
                )
            self.device = torch.device(self.platform.device_type, visible)
            getattr(torch, self.platform.device_type).set_device(self.device)
        torch.manual_seed(self.config.model.seed)
        if parallel.distributed_world_size > 1:
            from host.core.distributed.parallel_state import init_distributed

            if self.device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
                # the ranks (of every -dp engine) share this machine's cores
                torch.set_num_threads(max(1, (os.cpu_count() or 1) // (parallel.world_size * parallel.data_parallel_size)))
            init_distributed(parallel, self.rank, self.local_rank, self.platform.dist_backend, self.device)
        self.model_runner = ModelRunner(self.config, self.device, self.platform, make_step_kind)

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
        fill) and at twice what ``max_num_seqs`` full-length sequences need. On an accelerator: ``gpu_memory_utilization`` of device memory minus what a
        profiling run measures (see :meth:`_profile_device_memory`).
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
            # K and V of one token in every KV layer (a draft model's layers included)
            token_bytes = sum(s.page_size_bytes for s in runner.get_kv_cache_specs()) // runner.block_size
            useful = 2 * self.config.scheduler.max_num_seqs * self.config.scheduler.max_model_len * token_bytes
            return max(0, min(budget, CPU_DEFAULT_KV_BYTES, useful))
        return self._profile_device_memory()

    def _profile_device_memory(self) -> int:
        """Measure instead of guessing: run the largest step the scheduler can issue (the
        runner's :meth:`~ModelRunner.profile_run`) and read the device's peak allocation
        (weights plus activations) and the memory torch does not manage (driver context,
        communication and GEMM workspaces)."""
        mod = getattr(torch, self.device.type)
        mod.empty_cache()
        mod.reset_peak_memory_stats(self.device)
        self.model_runner.profile_run()
        mod.synchronize()
        peak = int(mod.max_memory_allocated(self.device))
        free, total = mod.mem_get_info(self.device)
        non_torch = max(0, (total - free) - int(mod.memory_reserved(self.device)))
        reserve = GRAPH_MEMORY_RESERVE if self.config.compilation.cuda_graphs else 0
        budget = kv_budget(total, self.config.cache.gpu_memory_utilization, peak, non_torch, reserve)
        logger.info(
            "Memory profile: %.2f GiB total x %.2f utilization; peak torch %.2f GiB (weights %.2f), "
            "non-torch %.2f GiB, graph reserve %.2f GiB -> KV cache %.2f GiB",
            total / 2**30, self.config.cache.gpu_memory_utilization, peak / 2**30,
            self.model_runner.model_memory_bytes() / 2**30, non_torch / 2**30, reserve / 2**30, budget / 2**30,
        )
        return budget

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate the KV cache; then, where no profiling run has happened (on CPU, or with
        ``--kv-cache-memory``), warm the model up with a profiling run of
        :data:`WARM_UP_TOKENS` tokens, so the first request does not pay one-time costs: the
        first call of a torch custom op imports ``torch._dynamo`` (about 1 s), oneDNN creates its
        primitives, kernels allocate their buffers."""
        assert self.model_runner is not None
        self.model_runner.initialize_kv_cache(num_blocks)
        if not self.model_runner.warmed_up:
            self.model_runner.profile_run(num_tokens=WARM_UP_TOKENS)

    def execute_model(self, scheduler_output: SchedulerOutput, non_blocking: bool = False) -> Any:
        """The step's output, or with ``non_blocking`` a handle whose ``get_output()`` gives it."""
        assert self.model_runner is not None
        return self.model_runner.execute_model(scheduler_output, non_blocking=non_blocking)

    def describe_worker(self) -> dict[str, Any]:
        """What ``EngineCore.utility_describe`` reports about this worker: platform, attention
        backend, resident weight bytes."""
        runner = getattr(self, "model_runner", None)
        return {
            "platform": getattr(self.platform, "name", None),
            "attention_backend": getattr(getattr(runner, "attn_backend", None), "name", None),
            "weight_bytes": getattr(runner, "resident_weight_bytes", None),
        }

    def execute_dummy_batch(self) -> None:
        """A one-token forward with no request (see :meth:`ModelRunner.execute_dummy_batch`)."""
        assert self.model_runner is not None
        self.model_runner.execute_dummy_batch()

    def shutdown(self) -> None:
        connector = getattr(self.model_runner, "kv_connector", None)
        if connector is not None:
            connector.shutdown()
        self.model_runner = None
        if self.config.parallel.distributed_world_size > 1:
            from host.core.distributed.parallel_state import destroy_distributed

            destroy_distributed()
