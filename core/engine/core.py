"""The engine core: scheduler + KV cache manager + executor, advanced one step at a time.

The engine-core process (:mod:`host.core.engine.process`) runs it behind ZMQ; the in-process
engine-core client (:mod:`host.core.engine.client`) drives it directly. Either way the front end
sees the same calls: ``add_request``, ``abort_requests``, ``step`` and the ``utility_*``
methods.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import time
from typing import Any, Iterable

from host.contracts.messages import EngineCoreOutputs, EngineCoreRequest, SchedulerStats
from host.contracts.request import Request, RequestStatus
from host.contracts.runner_output import ModelRunnerOutput
from host.contracts.scheduler_output import SchedulerOutput
from host.core.config import EngineConfig
from host.core.engine.batch_queue import BatchQueue
from host.core.kv_cache.hybrid_policy import kv_cache_layout
from host.core.kv_cache.manager import make_kv_cache_manager
from host.core.kv_cache.spec import KVCacheConfig, num_blocks_from_memory
from host.core.kv_transfer.factory import make_kv_connector
from host.core.plugins.manager import get_plugin_host
from host.core.scheduler.scheduler import Scheduler
from host.core.structured_output.engine import StructuredOutputManager
from host.core.utils import freeze_startup_objects
from host.interfaces.kv_connector import KVConnectorRole, KVOutputAggregator

logger = logging.getLogger("host.engine")

# how often an engine with only KV transfers in flight asks its workers for news
KV_POLL_INTERVAL_S = 0.005


class EngineCore:
    """Owns one model replica: sizes the KV cache, schedules and executes steps."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._resolve_quantization()
        self._check_pipeline_stages()
        # -dp N --enable-expert-parallel: the engines step together (core/engine/dp_step_sync.py)
        self.dp_step_sync: Any = None
        if getattr(config.parallel, "expert_data_parallel", False):
            from host.core.engine.dp_step_sync import DataParallelStepSync

            self.dp_step_sync = DataParallelStepSync(config.parallel)
            config.scheduler.async_scheduling = False  # one step at a time, in step with the other engines
        # the KV connector's scheduler role comes first: it may settle settings (a side-channel
        # port) in config.kv_transfer that the workers' role then reads
        self.kv_connector = make_kv_connector(config, KVConnectorRole.SCHEDULER)
        self.executor = self._make_executor()
        try:
            self.kv_cache_config = self._initialize_kv_cache()
        except BaseException:
            self.executor.shutdown()  # a failed start leaves no worker behind
            raise
        self.kv_cache_manager = make_kv_cache_manager(
            self.kv_cache_config,
            enable_caching=config.cache.enable_prefix_caching,
            max_model_len=config.scheduler.max_model_len,
        )
        pipelined = config.parallel.pipeline_parallel_size > 1
        self.scheduler = Scheduler(
            config.scheduler, config.cache, self.kv_cache_manager, send_token_ids=pipelined,
            kv_connector=self.kv_connector, kv_transfer_config=config.kv_transfer,
            steps_in_flight=pipelined or bool(config.scheduler.async_scheduling), lora_config=config.lora,
            speculative_config=getattr(config, "speculative", None),
            eplb=bool(getattr(getattr(config, "parallel", None), "enable_eplb", False)),
        )
        # every rank reports its own shard's transfers; a request is done once all have
        self._kv_outputs = KVOutputAggregator(config.parallel.world_size) if self.kv_connector is not None else None
        self._structured_output_manager: StructuredOutputManager | None = None
        # asynchronous scheduling: the step launched last, whose output is not processed yet
        self.async_scheduling = bool(config.scheduler.async_scheduling)
        self._in_flight: tuple[SchedulerOutput, Any] | None = None
        if self.async_scheduling:
            logger.info("Asynchronous scheduling: each step is planned while the previous one runs")
        # pipeline parallelism: up to max_concurrent_batches steps in flight (batch_queue.py)
        self.batch_queue = BatchQueue(self, self.executor.max_concurrent_batches) if pipelined else None
        freeze_startup_objects()  # the model and its imports are never walked by the collector again

    def _resolve_quantization(self) -> None:
        """Decide each layer's quantization method once, here, for every worker (``config.quant.plan``)."""
        from host.core.models.quant_plan import registered_methods, resolve_quant_plan
        from host.core.plugins.platform import current_platform

        if self.config.quant.plan is None:
            self.config.quant.plan = resolve_quant_plan(self.config, registered_methods(), current_platform())

    def _check_pipeline_stages(self) -> None:
        """A ``--pp-layer-partition`` that does not fit the model is a ValueError here, before
        any worker starts (each worker builds its stage with the same function)."""
        parallel = self.config.parallel
        if parallel.pipeline_parallel_size > 1:
            from host.core.models.pipeline import partition_layers

            num_layers = int(self.config.model.hf_config.num_hidden_layers)
            partition_layers(num_layers, parallel.pipeline_parallel_size, parallel.pp_layer_partition)

    def _make_executor(self) -> Any:
        """The executor plugin named by ``--distributed-executor-backend``, with its workers up."""
        executors = get_plugin_host().registry("executors")
        name = self.config.parallel.distributed_executor_backend
        if name not in executors:
            raise ValueError(
                f"distributed_executor_backend={name!r} is not registered; registered executors: "
                f"{', '.join(sorted(executors)) or 'none'}"
            )
        return executors[name](self.config)

    def _initialize_kv_cache(self) -> KVCacheConfig:
        """Size the KV cache (the override, or what the workers' profiling run leaves) and have
        every worker allocate it."""
        # one list per rank (a pipeline stage lists its own layers)
        rank_specs = self.executor.collective_rpc("get_kv_cache_specs")
        specs = max(rank_specs, key=lambda s: sum(x.page_size_bytes for x in s))
        # the workers lay their KV tensors out the same way (ModelRunner.kv_cache_layout)
        layout = kv_cache_layout(self.config, specs, log=True)
        cache = self.config.cache
        max_len = self.config.scheduler.max_model_len
        if cache.num_gpu_blocks_override is not None:
            num_blocks = cache.num_gpu_blocks_override
            source = "num_gpu_blocks_override"
        elif self.config.parallel.pipeline_parallel_size > 1:
            # a block id names a block in every layer of every stage: the tightest rank (its
            # budget over its own stage's page size) sets the count
            budgets = self.executor.collective_rpc("determine_available_memory")
            num_blocks = min(num_blocks_from_memory(b, s, max_len) for b, s in zip(budgets, rank_specs))
            source = f"KV budgets of {min(budgets) / 2**20:.1f}-{max(budgets) / 2**20:.1f} MiB per rank"
        else:
            available = self.executor.determine_available_memory()
            num_blocks = num_blocks_from_memory(available, specs, max_len, layout=layout)
            source = f"a KV budget of {available / 2**20:.1f} MiB"
        kv_cache_config = KVCacheConfig(num_blocks, cache.block_size, specs, layout=layout)
        cache.num_gpu_blocks = num_blocks
        self.executor.collective_rpc("initialize_kv_cache", (num_blocks,))
        logger.info(
            "KV cache: %d blocks x %d tokens (%d tokens, %.1f MiB) from %s",
            num_blocks, cache.block_size, (num_blocks - 1) * cache.block_size,
            kv_cache_config.kv_cache_bytes / 2**20, source,
        )
        return kv_cache_config

    def add_request(self, request: Request | EngineCoreRequest) -> None:
        """Queue a request (a message from the front end, or a :class:`Request` built here).

        The front end's input processor has validated the prompt and its params; what only the
        engine knows (a duplicate id, a prompt larger than the whole KV cache, a grammar that
        does not compile) raises ``ValueError`` here, before the request reaches a step."""
        if isinstance(request, EngineCoreRequest):
            request = Request.from_engine_core_request(request)
        if request.sampling_params.structured_outputs is not None:
            self.structured_output_manager.grammar_init(request)
        self.scheduler.add_request(request)

    @property
    def structured_output_manager(self) -> StructuredOutputManager:
        """Created with the first constrained request (it loads the tokenizer for xgrammar)."""
        if self._structured_output_manager is None:
            self._structured_output_manager = StructuredOutputManager(
                self.config.model.tokenizer, self.config.model.hf_config.vocab_size
            )
        return self._structured_output_manager

    def _wait_for_grammars(self, timeout: float = 0.05) -> None:
        """Nothing could run: if requests wait for their grammar, block briefly on the
        compilation instead of spinning (the compile threads need the CPU)."""
        if self._structured_output_manager is None:
            return
        futures = [
            r.structured_output.future
            for r in self.scheduler.requests.values()
            if r.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
        ]
        if futures:
            concurrent.futures.wait(futures, timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED)

    def attach_grammar_bitmask(self, scheduler_output: SchedulerOutput) -> None:
        """Bitmask rows for the constrained requests that sample a token this step (one per
        position of a request verifying drafts)."""
        if self._structured_output_manager is None:
            return
        requests = self.scheduler.requests
        constrained = [
            requests[req_id]
            for req_id in scheduler_output.num_scheduled_tokens
            if requests[req_id].structured_output is not None
            # num_computed_tokens already counts this step's tokens: a final chunk samples
            and requests[req_id].num_computed_tokens >= requests[req_id].num_tokens
        ]
        if constrained:
            scheduler_output.structured_output_request_ids = [r.request_id for r in constrained]
            drafts = scheduler_output.scheduled_spec_decode_tokens or {}
            scheduler_output.grammar_bitmask = self._structured_output_manager.grammar_bitmask(
                constrained, [list(drafts.get(r.request_id, ())) for r in constrained]
            )

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        self.scheduler.finish_requests(list(request_ids), RequestStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        return (self.scheduler.has_unfinished_requests() or self._in_flight is not None or bool(self.batch_queue)
                or self.scheduler.has_pending_kv_transfers())

    def step(self) -> EngineCoreOutputs:
        """Schedule, execute and update once; returns the new tokens of every request.

        With asynchronous scheduling a step launches step N+1 and then processes step N's
        output, so planning and output handling overlap the device's work; the outputs lag one
        step. While any request's sampling depends on its own history (``needs_history``:
        penalties, bad words, min_tokens, seeds, grammars), steps run one at a time. Under
        pipeline parallelism the batch queue keeps several steps in flight instead."""
        if self.batch_queue is not None:
            return self.batch_queue.step()
        if self.async_scheduling and not self._needs_sync():
            return self._step_async()
        if self._in_flight is not None:
            return self._finish_in_flight()
        return self._step_sync()

    def _needs_sync(self) -> bool:
        return any(r.sampling_params.needs_history for r in self.scheduler.requests.values())

    def _finish_in_flight(self) -> EngineCoreOutputs:
        scheduler_output, handle = self._in_flight
        self._in_flight = None
        return self.update_from_output(scheduler_output, handle.get_output())

    def update_from_output(self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput) -> EngineCoreOutputs:
        """The scheduler's update from one step's output (the KV connector's per-rank reports
        combined first)."""
        if self._kv_outputs is not None:
            reports = runner_output.kv_connector_output
            reports = reports if isinstance(reports, list) else [reports]
            runner_output.kv_connector_output = self._kv_outputs.add(reports)
        return self.scheduler.update_from_output(scheduler_output, runner_output)

    def _step_async(self) -> EngineCoreOutputs:
        scheduler_output = self.scheduler.schedule()
        if scheduler_output.total_num_scheduled_tokens == 0:
            done = self._finish_in_flight().outputs if self._in_flight is not None else []
            idle = self.idle_step(scheduler_output)
            idle.outputs = done + idle.outputs
            return idle
        handle = self.executor.execute_model(scheduler_output, non_blocking=True)
        previous, self._in_flight = self._in_flight, (scheduler_output, handle)
        if previous is None:
            return EngineCoreOutputs(outputs=[], scheduler_stats=self.scheduler.make_stats())
        return self.update_from_output(previous[0], previous[1].get_output())

    def _step_sync(self) -> EngineCoreOutputs:
        scheduler_output = self.scheduler.schedule()
        if self.dp_step_sync is not None and self.dp_step_sync.any_forward(scheduler_output.total_num_scheduled_tokens > 0):
            if scheduler_output.total_num_scheduled_tokens == 0:
                self.execute_dummy_batch()
        if scheduler_output.total_num_scheduled_tokens == 0:
            return self.idle_step(scheduler_output)
        self.attach_grammar_bitmask(scheduler_output)
        runner_output = self.executor.execute_model(scheduler_output)
        return self.update_from_output(scheduler_output, runner_output)

    def execute_dummy_batch(self) -> None:
        """A one-token forward with no request (``-dp N --enable-expert-parallel``): this engine's
        workers join the MoE collectives of the engines that run a step."""
        self.executor.collective_rpc("execute_dummy_batch")

    def idle_turn(self) -> None:
        """An engine with no request while another engine steps (``-dp N
        --enable-expert-parallel``): it agrees on the step's forward and runs a dummy one if any
        engine runs a real one."""
        assert self.dp_step_sync is not None
        if self.dp_step_sync.any_forward(False):
            self.execute_dummy_batch()

    def idle_step(self, scheduler_output: SchedulerOutput) -> EngineCoreOutputs:
        """A step that computes nothing: the runner drops finished / preempted requests, and
        requests the scheduler ended without a step (capped, failed grammars) are reported.
        With a KV connector the workers always see the step: it may start loads, and they
        report transfers that finished meanwhile (polled every few ms while only transfers
        are pending)."""
        empty = ModelRunnerOutput(req_ids=[], req_id_to_index={}, sampled_token_ids=[])
        if self.kv_connector is not None:
            if not (scheduler_output.finished_req_ids or scheduler_output.preempted_req_ids
                    or self.scheduler.has_finished_requests()):
                time.sleep(KV_POLL_INTERVAL_S)  # nothing but transfers in flight: do not spin
            empty = self.executor.execute_model(scheduler_output)
        elif scheduler_output.finished_req_ids or scheduler_output.preempted_req_ids:
            self.executor.execute_model(scheduler_output)
        self._wait_for_grammars()
        return self.update_from_output(scheduler_output, empty)

    # -- utilities: named calls the front end makes (UtilityCall over the wire) -----------------
    def utility_plugins(self) -> list[dict[str, Any]]:
        """This process's plugin records (what ``host plugins list --json`` shows), then those of
        the worker processes when the workers run elsewhere (``mp``, ``ray``: rows with
        ``process: "worker"``, their ``rank`` and ``process_pid``)."""
        records = [dict(r.to_dict(), process="engine", process_pid=os.getpid()) for r in get_plugin_host().list_records()]
        if getattr(self.executor, "worker", None) is None:
            records += [row for rank_rows in self.executor.collective_rpc("plugin_records") for row in rank_rows]
        return records

    def utility_describe(self) -> dict[str, Any]:
        """Where this engine runs: process, platform, attention backend and KV cache size (the
        worker's, or rank 0's when the workers are processes of their own)."""
        info = self.executor.collective_rpc("describe_worker")[0]  # Worker.describe_worker
        return {
            "pid": os.getpid(),
            **info,
            "num_gpu_blocks": self.kv_cache_manager.num_blocks,
            "block_size": self.kv_cache_config.block_size,
            "quantization": self.config.quant.plan.describe() if self.config.quant.plan is not None else "none",
        }

    def utility_reset_prefix_cache(self) -> bool:
        return self.scheduler.reset_prefix_cache()

    def utility_stats(self) -> SchedulerStats:
        return self.scheduler.make_stats()

    def shutdown(self) -> None:
        """Stop the executor (its workers) and the engine's helpers; idempotent."""
        if getattr(self, "_shut_down", False):
            return
        self._shut_down = True
        if self._structured_output_manager is not None:
            self._structured_output_manager.shutdown()
        self.executor.shutdown()
        if self.kv_connector is not None:
            self.kv_connector.shutdown()
