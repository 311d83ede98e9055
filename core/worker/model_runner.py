"""The model runner: turns a :class:`SchedulerOutput` into one forward pass and sampled tokens.

The runner owns loading, the KV cache, memory profiling and decode graphs, and exposes one step's
*phases* as public methods: :meth:`ModelRunner.update_states`, :meth:`ModelRunner.prepare_inputs`,
:meth:`ModelRunner.run_forward`, :meth:`ModelRunner.logits_at`,
:meth:`ModelRunner.keep_sampled_on_device`, :meth:`ModelRunner.record_sampled` and
:meth:`ModelRunner.prompt_logprobs`. A *step kind* composes them into a whole step: the plain
sampling step (:mod:`.sampling_step`), the speculative verify step (:mod:`host.core.spec_decode.worker.verify`)
or the pooling step (:mod:`host.core.pooling.worker`). The runner imports none of them: it is handed a
factory for its step kind (the worker's :func:`~host.core.worker.worker.make_step_kind`) and
calls it through the :class:`~host.core.worker.step_kind.StepKind` protocol.

It keeps a *persistent batch*: per-request rows of token ids, computed-token counts and block
tables that live across steps, so each step only applies what changed (new requests, new
blocks, finished requests) instead of rebuilding the batch. Inputs (``input_ids``, ``positions``,
``slot_mapping``, ``query_start_loc``, ``seq_lens``) are built with vectorised numpy/torch ops
over the whole batch, never with a per-token Python loop.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

import numpy as np
import torch

from host.contracts.forward_context import ForwardContext, set_forward_context
from host.contracts.messages import TokenLogprobs
from host.contracts.runner_output import ModelRunnerOutput, StepHandle, StepTiming
from host.contracts.scheduler_output import NewRequestData, SchedulerOutput
from host.core.config import EngineConfig
from host.core.worker.graph_runner import DecodeGraphs
from host.core.worker.host_staging import HostStaging
from host.core.worker.input_batch import CachedRequestState, InputBatch, StepInputs
from host.core.worker.kv_buffer import allocate_kv_buffer
from host.core.worker.pipeline import PipelineStage
from host.core.worker.sampler import LogprobsTensors, Sampler, gather_logprobs
from host.core.worker.step_kind import StepKind
from host.interfaces.attention import AttentionBackend, CommonAttentionMetadata

logger = logging.getLogger("host.model_runner")


def kv_heads_on_rank(model: Any, hf_config: Any) -> int:
    """KV heads each attention layer of ``model`` caches on this rank (its ``kv_heads_per_rank``
    under -tp, else the config's)."""
    per_rank = getattr(model, "kv_heads_per_rank", None)
    if per_rank is not None:
        return int(per_rank)
    return int(getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads)


def head_size_of(hf_config: Any) -> int:
    return int(getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads)


class ModelRunner:
    """Owns the model, the KV cache tensors and the persistent batch of one worker.

    ``make_step`` builds the runner's step kind once the model is loaded (it receives the
    runner); :meth:`execute_model` runs every step through it."""

    def __init__(self, config: EngineConfig, device: torch.device, platform: Any,
                 make_step: Callable[["ModelRunner"], StepKind]) -> None:
        self.config = config
        self.make_step = make_step
        self.step_kind: StepKind | None = None  # built by load_model
        self.device = device
        self.platform = platform
        self.model: torch.nn.Module | None = None
        self.hf_config: Any = None
        self.dtype: torch.dtype = torch.float32
        self.attn_backend: type[AttentionBackend] | None = None
        self.kv_caches: list[torch.Tensor] = []
        self.kv_buffer: torch.Tensor | None = None
        self.input_batch: InputBatch | None = None
        self.sampler = Sampler()
        self._forward: Any = None  # the model, or its compiled forward (-O3)
        self.staging = HostStaging(device)
        # the last step's sampled ids (on the device) and each request's row in them
        self._prev_sampled: tuple[torch.Tensor, dict[str, int]] | None = None
        self.num_in_flight_tokens = 0  # inputs taken from the device (asynchronous scheduling)
        self.decode_graphs: DecodeGraphs | None = None
        self.warmed_up = False  # a profiling run has paid the first-call costs (profile_run)
        self.pipeline: PipelineStage | None = None  # this worker's stage (set by load_model)
        self._attention_layers: dict[int, Any] = {}
        # a hybrid KV cache: each layer's KV cache group and the number of groups (1: one group)
        self._group_of_layer: list[int] = []
        self._num_kv_groups = 1
        # set to a list to record a StepTiming per step (benchmarks read it)
        self.step_timings: list[StepTiming] | None = None
        self._attn_builder: Any = None
        self._attn_metadata: Any = None  # the last step's (a KV connector's save_kv_layer reads it)
        self.kv_connector: Any = None  # WorkerKVConnector with --kv-transfer-config
        self.lora: Any = None  # WorkerLoRA with --enable-lora
        parallel = getattr(config, "parallel", None)
        self.eplb_enabled = bool(getattr(parallel, "enable_eplb", False))
        self.eplb: Any = None  # EplbState with --enable-eplb, built at the first step
        self.block_size = config.cache.block_size
        if config.compilation.custom_ops is None:  # a config built without EngineArgs
            config.compilation.resolve(config.scheduler.max_num_seqs, platform.can_capture_graphs())

    # -- start-up ----------------------------------------------------------------------------

    def load_model(self) -> None:
        from host.core.models.loader import load_model
        from host.core.models.quant_linear import weight_bytes
        from host.core.plugins.manager import get_plugin_host
        from host.core.worker.attention_selector import select_attention_backend

        self.dtype = getattr(torch, self.config.model.dtype)  # resolved by EngineArgs
        self.attn_backend = select_attention_backend(self.config, self.platform, self.config.model.hf_config, self.dtype)
        # the kernel table for this engine config: the core's references and every plugin's
        # host_offer_kernels, before the weights load and the platform prepares the model
        get_plugin_host().offer_kernels(self.platform, self.config)
        self.model, self.hf_config = load_model(
            self.config.model, self.config.load, self.attn_backend, device=self.device,
            quant_plan=getattr(self.config, "quant", None) and self.config.quant.plan,
            parallel_config=getattr(self.config, "parallel", None),
        )
        self.model.eval()
        if self.eplb_enabled:  # refuse at start-up what the load balancer could not rearrange
            layers = self.model.moe_layers() if hasattr(self.model, "moe_layers") else []
            if not layers:
                raise ValueError(f"--enable-eplb balances the experts of a mixture-of-experts model; "
                                 f"{type(self.model).__name__} has none (drop --enable-eplb)")
            for layer in layers:
                layer.slot_tensors()
        self.weight_bytes = weight_bytes(self.model)
        self.platform.prepare_model(self.model, self.config)
        self.pipeline = PipelineStage.of(self.model, self.hf_config, self.dtype, self.device)
        self.pipeline.disable_whole_stack_paths(self.model, self.config.compilation)
        if getattr(self.config, "lora", None) is not None:  # --enable-lora: wrap the linears (docs/lora.md)
            from host.core.lora.worker import WorkerLoRA

            self.lora = WorkerLoRA(self.config, self.model, self.hf_config, self.dtype, self.device)
        # what the weights occupy once the platform has prepared them (repacked copies included)
        self.resident_weight_bytes = weight_bytes(self.model)
        self.sampler = Sampler(draw_kernel=self.platform.sampling_kernel(self.config))
        # the step kind is built before compiling (a pooling step turns decode graphs and the
        # fused decode kernel off) and loads after it (a proposer's draft model)
        self.step_kind = self.make_step(self)
        self._maybe_compile()
        self.step_kind.load()
        logger.info(
            "Loaded %s (%s) with attention backend %s",
            self.config.model.architecture,
            self.config.model.dtype,
            self.attn_backend.name,
        )

    def _maybe_compile(self) -> None:
        """``-O3`` (or ``--torch-compile``): compile the model's forward with ``torch.compile`` (the platform's backend,
        dynamic token count). Attention becomes the opaque ``host::attention`` op, so the graph
        runs from the embedding to the final norm with attention calls in between."""
        from host.core.models.attention_layer import Attention

        self._attention_layers = {m.layer_idx: m for m in self.model.modules() if isinstance(m, Attention)}
        self._forward = self.model
        if not self.config.compilation.torch_compile:
            return
        for layer in self._attention_layers.values():
            layer.opaque = True
        backend = getattr(self.platform, "simple_compile_backend", "inductor")
        self._forward = torch.compile(self.model, backend=backend, dynamic=True)
        logger.info("-O3: model forward compiled with torch.compile (backend %s, dynamic shapes)", backend)

    @property
    def spec_decode(self) -> Any:
        """The speculative verify step (``--speculative-config``, :mod:`host.core.spec_decode.worker.verify`),
        else ``None``."""
        return self.step_kind if self.step_kind is not None and self.step_kind.name == "speculative" else None

    @property
    def pooling(self) -> Any:
        """The pooling step of a pooling model (:mod:`host.core.pooling.worker`), else ``None``."""
        return self.step_kind if self.step_kind is not None and self.step_kind.name == "pooling" else None

    @property
    def attention_layers(self) -> dict[int, Any]:
        """The model's attention layers by global layer index (what a forward context carries)."""
        return self._attention_layers

    def model_forward(self, input_ids: torch.Tensor, positions: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """The model's forward as this runner calls it: compiled under ``-O3``, else the model
        itself. The caller sets the forward context."""
        return (self._forward if self._forward is not None else self.model)(input_ids, positions, **kwargs)

    @property
    def num_layers(self) -> int:
        return int(self.hf_config.num_hidden_layers)

    @property
    def kv_layers(self) -> range:
        """Global indices of the layers whose KV cache this worker holds (its pipeline stage's)."""
        return self.pipeline.layers if self.pipeline is not None else range(self.num_layers)

    @property
    def num_kv_heads(self) -> int:
        """KV heads each attention layer caches on this rank (fewer than the model's with -tp)."""
        return kv_heads_on_rank(self.model, self.hf_config)

    @property
    def head_size(self) -> int:
        return head_size_of(self.hf_config)

    def layer_sliding_windows(self) -> dict[int, int | None]:
        """Each attention layer's sliding window (``None``: full attention), by global layer index,
        as the model built it (its :class:`~host.core.models.attention_layer.Attention` modules:
        Gemma's local and global layers differ); for a model without such modules, the config's
        window for every layer."""
        from host.core.models.attention_layer import Attention
        from host.core.worker.attention_selector import config_sliding_window

        layers = {m.layer_idx: m.sliding_window for m in self.model.modules() if isinstance(m, Attention)} if self.model is not None else {}
        if layers:
            return layers
        window = config_sliding_window(self.hf_config)
        return {idx: window for idx in self.kv_layers}

    def get_kv_cache_specs(self) -> list[Any]:
        """One spec per attention layer of this worker's stage: a ``SlidingWindowSpec`` for a
        layer that attends within a window, a ``FullAttentionSpec`` for the others."""
        from host.core.kv_cache.spec import FullAttentionSpec, SlidingWindowSpec

        windows = self.layer_sliding_windows()
        kv_dtype = str(self.kv_cache_dtype).removeprefix("torch.")
        specs = []
        for idx in self.kv_layers:
            window = windows.get(idx)
            if window:
                specs.append(SlidingWindowSpec(self.block_size, self.num_kv_heads, self.head_size, kv_dtype, sliding_window=int(window)))
            else:
                specs.append(FullAttentionSpec(self.block_size, self.num_kv_heads, self.head_size, kv_dtype))
        if self.step_kind is not None:  # a draft model's layers share the block budget
            specs += self.step_kind.kv_cache_specs()
        return specs

    def kv_cache_layout(self) -> Any:
        """How this worker's KV layers are grouped (:mod:`host.core.kv_cache.groups`): decided
        from the config and the specs exactly as the engine core decides it."""
        from host.core.kv_cache.hybrid_policy import kv_cache_layout

        return kv_cache_layout(self.config, self.get_kv_cache_specs())

    @property
    def kv_cache_dtype(self) -> torch.dtype:
        """The element type of the KV pages: the model dtype, or float8_e4m3fn for
        ``--kv-cache-dtype fp8`` (:func:`host.core.kv_cache.spec.kv_cache_element_dtype`)."""
        from host.core.kv_cache.spec import kv_cache_element_dtype

        return getattr(torch, kv_cache_element_dtype(self.config.cache.cache_dtype, str(self.dtype)))

    def model_memory_bytes(self) -> int:
        """Bytes of the model's weights as loaded (quantized blocks and scales included, before
        any platform repacking): what one forward streams."""
        return self.weight_bytes

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate one flat buffer for every layer's KV cache (of this worker's stage) and view
        it per layer; ``kv_caches`` is indexed by global layer index. With a hybrid layout the
        buffer holds ``group_size`` tensors of ``num_blocks`` blocks, and layer ``j`` of every
        KV cache group views tensor ``j`` (a block id belongs to one group)."""
        assert self.attn_backend is not None and self.pipeline is not None
        shape = self.attn_backend.get_kv_cache_shape(num_blocks, self.block_size, self.num_kv_heads, self.head_size)
        per_layer = int(np.prod(shape))
        layout = self.kv_cache_layout()
        max_model_len = self.config.scheduler.max_model_len
        max_blocks = -(-max_model_len // self.block_size)
        if layout.is_hybrid:
            self._init_hybrid_kv_cache(layout, shape, per_layer)
        else:
            self.kv_buffer = allocate_kv_buffer(per_layer * len(self.kv_layers), self.kv_cache_dtype, torch.device(self.device))
            self.kv_caches = self.pipeline.layer_views(self.kv_buffer, shape)
        self.input_batch = InputBatch(self.config.scheduler.max_num_seqs, max_model_len, max_blocks, layout.num_groups)
        self.num_blocks = num_blocks
        if self.step_kind is not None:  # a draft model's own KV tensors
            self.step_kind.initialize_kv_cache(num_blocks)
        if getattr(self.config, "kv_transfer", None) is not None:
            from host.core.kv_transfer.worker import WorkerKVConnector

            self.kv_connector = WorkerKVConnector(self.config, {i: self.kv_caches[i] for i in self.kv_layers})
        logger.info(
            "KV cache: %d blocks of %d tokens, %.1f MiB", num_blocks, self.block_size, self.kv_buffer.numel() * self.kv_buffer.element_size() / 2**20
        )
        self._maybe_capture_graphs()

    def _init_hybrid_kv_cache(self, layout: Any, shape: tuple[int, ...], per_layer: int) -> None:
        """``group_size`` KV tensors shared by the groups; each layer views its position's one.
        Paths that run every layer with one block table are turned off: the fused whole-stack
        decode kernel and decode graphs."""
        self.kv_buffer = allocate_kv_buffer(per_layer * layout.group_size, self.kv_cache_dtype, torch.device(self.device))
        tensors = [self.kv_buffer[j * per_layer : (j + 1) * per_layer].view(shape) for j in range(layout.group_size)]
        self.kv_caches = [torch.empty(0)] * self.num_layers
        self._group_of_layer = [0] * self.num_layers
        for gid, group in enumerate(layout.groups):
            for j, layer in enumerate(group.layers):
                self.kv_caches[layer] = tensors[j]
                self._group_of_layer[layer] = gid
        self._num_kv_groups = layout.num_groups
        decoder = getattr(self.model, "model", None)
        if getattr(decoder, "decode_kernel", None) is not None:
            decoder.decode_kernel = None
            logger.info("Hybrid KV cache: the fused decode kernel is off (it runs every layer with one block table)")
        compilation = self.config.compilation
        if compilation.cuda_graphs:
            if "cuda_graphs" in compilation.explicit or "cuda_graph_sizes" in compilation.explicit:
                raise ValueError(
                    "decode graphs (--cuda-graph-sizes) capture one block table and cannot run with hybrid KV "
                    "cache groups; drop the flag or pass --disable-hybrid-kv-cache-manager"
                )
            logger.info("Hybrid KV cache: decode graphs are off (they capture one block table)")
            compilation.cuda_graphs = False
            compilation.cuda_graph_sizes = []

    def _maybe_capture_graphs(self) -> None:
        """Capture decode graphs when the compilation config asks for them. A backend that
        cannot run inside a graph turns them off with a warning at the level's default, and is
        an error when graphs were asked for explicitly."""
        compilation = self.config.compilation
        if not compilation.cuda_graphs or not compilation.cuda_graph_sizes:
            return
        if not getattr(self.attn_backend, "supports_cuda_graphs", False):
            message = (
                f"attention backend {self.attn_backend.name!r} cannot run inside device graphs"
            )
            if "cuda_graphs" in compilation.explicit or "cuda_graph_sizes" in compilation.explicit:
                raise ValueError(f"{message}; drop --cuda-graph-sizes or choose a backend that can (triton_paged)")
            logger.warning("%s; decode graphs are off", message)
            compilation.cuda_graphs = False
            compilation.cuda_graph_sizes = []
            return
        self.decode_graphs = DecodeGraphs(self, compilation.cuda_graph_sizes)
        with torch.inference_mode():
            self.decode_graphs.capture()

    @torch.inference_mode()
    def profile_run(self, num_tokens: int | None = None) -> None:
        """The largest step the scheduler can issue, for memory profiling before the KV cache
        exists: ``max_num_batched_tokens`` dummy tokens (``num_tokens``, where given and
        smaller) through the (possibly compiled) forward with attention skipped (metadata
        ``None``: the backends return zeros and touch no cache), then logits and a random draw
        for ``max_num_seqs`` rows (at most one per token). Sets :attr:`warmed_up`."""
        from host.core.worker.sampler import SamplingMetadata

        sched = self.config.scheduler
        n = max(1, min(sched.max_num_batched_tokens, sched.max_num_seqs * sched.max_model_len))
        if num_tokens is not None:
            n = max(1, min(n, num_tokens))
        self.warmed_up = True
        input_ids = torch.zeros(n, dtype=torch.int64, device=self.device)
        positions = torch.arange(n, device=self.device) % sched.max_model_len
        no_cache = [torch.empty(0, dtype=self.dtype, device=self.device)] * self.num_layers
        stage_kw = self.pipeline.dummy_kwargs(n) if self.pipeline is not None else {}
        with set_forward_context(ForwardContext(None, no_cache, {"attention_layers": self._attention_layers})):
            hidden = self.model_forward(input_ids, positions, **stage_kw)
        if (self.pipeline is not None and not self.pipeline.is_last) or (self.step_kind is not None and not self.step_kind.computes_logits):
            return  # no logits on this stage, or none at all (a pooling model)
        rows = min(sched.max_num_seqs, n)
        logits = self.model.compute_logits(hidden[:rows])
        md = SamplingMetadata(temperature=torch.ones(rows), all_greedy=False, all_random=True,
                              top_k=torch.full((rows,), 50, dtype=torch.int64), top_p=torch.full((rows,), 0.9))
        self.sampler(logits, md)

    @torch.inference_mode()
    def execute_dummy_batch(self) -> None:
        """A one-token forward with no request and no KV cache (attention metadata ``None``):
        with ``-dp N --enable-expert-parallel`` an engine with nothing to run still joins the MoE
        layers' collectives of the engines that run a step. It counts as a step for EPLB, which
        every rank must count alike."""
        input_ids = torch.zeros(1, dtype=torch.int64, device=self.device)
        positions = torch.zeros(1, dtype=torch.int64, device=self.device)
        no_cache = [torch.empty(0, dtype=self.dtype, device=self.device)] * self.num_layers
        with set_forward_context(ForwardContext(None, no_cache, {"attention_layers": self._attention_layers})):
            self.model_forward(input_ids, positions)
        if self.eplb_enabled:
            self._eplb_step(None)

    # -- one step: the phases a step kind composes ---------------------------------------------

    def update_states(self, so: SchedulerOutput) -> bool:
        """Phase 1: begin a step. The host staging buffers turn over to this step's, and the
        persistent batch takes ``so``'s changes: finished and preempted requests leave, new
        (and resumed) ones join, cached ones get their computed-token counts and new blocks,
        and a pipeline stage that does not sample takes the tokens the last stage sent; then
        the rows are condensed. Returns whether the step has tokens to run (``False``: nothing
        scheduled, or no request left in the batch; the step kind then returns an empty
        output without running the later phases)."""
        self.staging.next_step()
        batch = self.input_batch
        assert batch is not None
        for req_id in so.finished_req_ids | so.preempted_req_ids:
            batch.remove(req_id)
        for new in so.scheduled_new_reqs:
            batch.remove(new.req_id)  # resumed after preemption: start over
            batch.add(self._state_from_new(new))
        cached = so.scheduled_cached_reqs
        for req_id, new_blocks, computed in zip(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens):
            index = batch.req_id_to_index[req_id]
            batch.num_computed_tokens[index] = computed
            if new_blocks:
                batch.append_blocks(index, new_blocks)
                batch.states[index].block_ids.extend(new_blocks)
        if cached.new_group_block_ids:  # a hybrid KV cache: the other groups' new blocks
            for req_id, new_blocks, groups in zip(cached.req_ids, cached.new_block_ids, cached.new_group_block_ids):
                if new_blocks:
                    index = batch.req_id_to_index[req_id]
                    start = int(batch.num_blocks[index]) - len(new_blocks)
                    for table, ids in zip(batch.group_block_tables, groups):
                        table[index, start : start + len(ids)] = ids
                    state = batch.states[index]
                    for own, ids in zip(state.group_block_ids, groups):
                        own.extend(ids)
        self.pipeline.apply_new_token_ids(batch, cached)  # a stage that does not sample
        batch.condense()
        return so.total_num_scheduled_tokens != 0 and batch.num_reqs != 0

    @staticmethod
    def _state_from_new(new: NewRequestData) -> CachedRequestState:
        """The runner's state starts as the scheduler's description, field for field (lists
        copied: the runner appends to them)."""
        fields = {f.name: getattr(new, f.name) for f in dataclasses.fields(new)}
        state = CachedRequestState(**{k: list(v) if isinstance(v, list) else v for k, v in fields.items()})
        if state.group_block_ids:  # a hybrid KV cache's other groups: the runner extends them
            state.group_block_ids = [list(ids) for ids in state.group_block_ids]
        return state

    def prepare_inputs(self, so: SchedulerOutput) -> StepInputs:
        """Phase 2: the step's flattened inputs as host arrays, built with vectorised numpy
        from the persistent batch (after :meth:`update_states`). Each scheduled request
        contributes its next ``so.num_scheduled_tokens[req_id]`` tokens, read from its row of
        ``input_batch.token_ids`` starting at its computed-token count; a caller may append
        tokens to a row (and raise its ``num_tokens``) for this call only, as the speculative
        step does with drafts. Input tokens that the previous step sampled but the host has not
        read yet (asynchronous scheduling) are listed in ``placeholders`` and filled on the
        device by :meth:`run_forward`. Reads the batch only."""
        batch = self.input_batch
        assert batch is not None
        scheduled = so.num_scheduled_tokens
        live = batch.req_ids[: batch.num_reqs]
        if len(scheduled) == len(live):
            rows = np.arange(len(live))
            req_ids = list(live)
        else:
            # a running request can sit a step out (asynchronous scheduling: its token in flight
            # already ends it); the step covers the scheduled rows only
            rows = np.array([i for i, r in enumerate(live) if r in scheduled], dtype=np.int64)
            req_ids = [live[i] for i in rows]
        num_reqs = len(req_ids)
        num_scheduled = np.array([scheduled[r] for r in req_ids], dtype=np.int64)
        total = int(num_scheduled.sum())
        cu = np.cumsum(num_scheduled)
        req_indices = np.repeat(rows, num_scheduled)  # the batch row of each token
        offsets = np.arange(total) - np.repeat(cu - num_scheduled, num_scheduled)
        computed = batch.num_computed_tokens[rows]
        positions = batch.num_computed_tokens[req_indices] + offsets
        flat_index = req_indices * batch.max_model_len + positions
        input_ids = batch.token_ids.reshape(-1)[flat_index]
        block_numbers = batch.block_table[req_indices, positions // self.block_size]
        slot_mapping = block_numbers.astype(np.int64) * self.block_size + positions % self.block_size
        query_start_loc = np.zeros(num_reqs + 1, dtype=np.int32)
        query_start_loc[1:] = cu
        seq_lens = (computed + num_scheduled).astype(np.int32)
        max_blocks = int(batch.num_blocks[rows].max()) if num_reqs else 0
        # input tokens the previous step sampled but the host has not seen yet (asynchronous
        # scheduling): their ids are taken from that step's device tensor
        in_flight = positions >= batch.num_tokens[req_indices]
        placeholders = None
        if in_flight.any():
            prev_rows = self._prev_sampled[1]
            flat = np.flatnonzero(in_flight)
            src = np.array([prev_rows[live[r]] for r in req_indices[flat]], dtype=np.int64)
            placeholders = (flat, src)
        block_table = batch.block_table[:num_reqs, :max_blocks] if num_reqs == len(live) else batch.block_table[rows, :max_blocks]
        group_tables = None
        if batch.group_block_tables:  # a hybrid KV cache: every other group's table and slots
            group_tables = []
            in_block = positions % self.block_size
            for table in batch.group_block_tables:
                numbers = table[req_indices, positions // self.block_size]
                group_tables.append((
                    table[:num_reqs, :max_blocks] if num_reqs == len(live) else table[rows, :max_blocks],
                    numbers.astype(np.int64) * self.block_size + in_block,
                ))
        return StepInputs(
            req_ids=req_ids,
            rows=rows,
            num_scheduled=num_scheduled,
            input_ids=input_ids,
            positions=positions,
            slot_mapping=slot_mapping,
            query_start_loc=query_start_loc,
            seq_lens=seq_lens,
            block_table=block_table,
            placeholders=placeholders,
            group_tables=group_tables,
        )

    def _attention_metadata(self, inputs: StepInputs) -> CommonAttentionMetadata:
        """Device copies of the step's layout (through pinned memory on an accelerator, without
        waiting), plus the host copies metadata builders may read without a sync."""
        stage = self.staging
        num_reqs = len(inputs.req_ids)
        return CommonAttentionMetadata(
            query_start_loc=stage.to_device("qsl", inputs.query_start_loc),
            seq_lens=stage.to_device("seq", inputs.seq_lens),
            block_table=stage.to_device("blocks", inputs.block_table),
            slot_mapping=stage.to_device("slots", inputs.slot_mapping),
            num_reqs=num_reqs,
            num_actual_tokens=len(inputs.input_ids),
            max_query_len=int(inputs.num_scheduled.max()) if num_reqs else 0,
            max_seq_len=int(inputs.seq_lens.max()) if num_reqs else 0,
            block_size=self.block_size,
            query_start_loc_cpu=torch.from_numpy(inputs.query_start_loc),
            seq_lens_cpu=torch.from_numpy(inputs.seq_lens),
        )

    def _in_flight_ids(self, inputs: StepInputs) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(indices into the step's input ids, the ids) for tokens sampled by the previous step
        that the host has not read back: a gather on the device, no wait."""
        if inputs.placeholders is None:
            return None
        flat, src = inputs.placeholders
        prev_ids = self._prev_sampled[0]
        self.num_in_flight_tokens += len(flat)
        return self.staging.to_device("fill_at", flat), prev_ids[self.staging.to_device("fill_src", src)]

    def run_forward(self, inputs: StepInputs) -> torch.Tensor:
        """Phase 3: hidden states ``[len(inputs.input_ids), hidden]`` of the step's tokens (on
        a stage before the last, its output for the next stage): a graph replay for a decode
        batch that fits one, else the (possibly compiled) forward under a forward context with
        this step's attention metadata, KV caches and LoRA mapping. Input tokens still in
        flight are filled from the ids of :meth:`keep_sampled_on_device` first. Writes the KV
        cache of every input token; leaves the persistent batch alone."""
        graphs = self.decode_graphs
        n = len(inputs.req_ids)
        fill = self._in_flight_ids(inputs)
        if graphs is not None and len(inputs.input_ids) == n and graphs.size_for(n) is not None:
            return graphs.run(inputs.input_ids, inputs.positions, inputs.slot_mapping, inputs.seq_lens, inputs.block_table, fill)
        common = self._attention_metadata(inputs)
        if self._attn_builder is None:
            # one builder for the runner's life, so its scratch buffers carry over between steps
            self._attn_builder = self.attn_backend.get_builder_cls()(self.attn_backend, self.device)
        attn_metadata = self._attn_metadata = self._attn_builder.build(common)
        input_ids = self.staging.to_device("ids", inputs.input_ids)
        if fill is not None:
            input_ids[fill[0]] = fill[1]
        positions = self.staging.to_device("pos", inputs.positions)
        stage_kw = self.pipeline.forward_kwargs(len(inputs.input_ids))  # the previous stage's output
        # query_start_loc (host ints): where each prompt starts, for an encoder's own attention (models/bert.py)
        extra = {"attention_layers": self._attention_layers, "query_start_loc": inputs.query_start_loc}
        ctx = ForwardContext(attn_metadata, self.kv_caches, extra)
        if inputs.group_tables is not None:
            ctx.layer_attn_metadata = self._group_metadata(common, attn_metadata, inputs)
        if self.lora is not None:
            ctx.lora_mapping = self.lora.step_mapping([self.input_batch.states[i] for i in inputs.rows], inputs.num_scheduled)
        with set_forward_context(ctx):
            return self.model_forward(input_ids, positions, **stage_kw)

    def _group_metadata(self, common: CommonAttentionMetadata, first: Any, inputs: StepInputs) -> list[Any]:
        """A hybrid KV cache's per-layer attention metadata: each group's is built from the
        step's layout with that group's block table and slot mapping (``first``: group 0's)."""
        stage = self.staging
        per_group = [first]
        for g, (table, slots) in enumerate(inputs.group_tables, 1):
            group_common = dataclasses.replace(
                common, block_table=stage.to_device(f"blocks{g}", table), slot_mapping=stage.to_device(f"slots{g}", slots)
            )
            per_group.append(self._attn_builder.build(group_common))
        return [per_group[g] for g in self._group_of_layer]

    def logits_at(self, hidden: torch.Tensor, inputs: StepInputs, token_rows: np.ndarray) -> torch.Tensor:
        """Phase 4: the logits ``[len(token_rows), vocab]`` at the given rows of ``hidden``
        (indices into the step's input tokens, increasing); when they cover every input token
        ``hidden`` is scored whole, without a gather."""
        if len(token_rows) == len(inputs.input_ids):
            return self.model.compute_logits(hidden)
        return self.model.compute_logits(hidden[self.staging.to_device("last", token_rows)])

    def keep_sampled_on_device(self, sampled_token_ids: torch.Tensor, req_ids: list[str]) -> None:
        """Phase 5: remember this step's sampled ids (on the device, row ``i`` for
        ``req_ids[i]``) so that the next step can take an input token the host has not read
        back yet from them (asynchronous scheduling: :meth:`prepare_inputs` lists such tokens,
        :meth:`run_forward` fills them)."""
        self._prev_sampled = (sampled_token_ids, {r: i for i, r in enumerate(req_ids)})

    def record_sampled(
        self, req_ids: list[str], final: np.ndarray, sampled: list[int], logprobs_k: list[int | None],
        logprobs: LogprobsTensors | None,
    ) -> tuple[list[list[int]], list[list[TokenLogprobs] | None]]:
        """Phase 6: append each final row's token (``sampled[i]`` for ``req_ids[i]`` where
        ``final[i]``) to the persistent batch, found by request id: with asynchronous
        scheduling the next step may have moved or dropped the row already. Returns each row's
        sampled token list (``[]`` for a prefill chunk short of its prompt's end) and its
        logprobs (``None`` where not asked for: ``logprobs_k[i]`` is ``None``)."""
        batch = self.input_batch
        # a prefill chunk that did not reach the end yet samples nothing
        sampled_lists: list[list[int]] = [[] for _ in req_ids]
        logprob_lists: list[list[TokenLogprobs] | None] = [None] * len(req_ids)
        index_of, states = batch.req_id_to_index, batch.states
        rows: list[int] = []
        tokens: list[int] = []
        for i in np.flatnonzero(final).tolist():
            token = int(sampled[i])
            sampled_lists[i] = [token]
            index = index_of.get(req_ids[i])
            if index is not None:
                rows.append(index)
                tokens.append(token)
                states[index].output_token_ids.append(token)
            k = logprobs_k[i]
            if k is not None and logprobs is not None:
                logprob_lists[i] = [logprobs.row(i, k)]
        if rows:
            r = np.array(rows, dtype=np.int64)
            n = batch.num_tokens[r]
            fits = n < batch.max_model_len
            batch.token_ids[r[fits], n[fits]] = np.array(tokens, dtype=np.int64)[fits]
            batch.num_tokens[r] = n + 1
        return sampled_lists, logprob_lists

    def prompt_logprobs(
        self, hidden: torch.Tensor, states: list[CachedRequestState], computed_before: np.ndarray, num_scheduled: np.ndarray
    ) -> dict[str, list[TokenLogprobs]]:
        """Phase 7 (for requests that asked): logprobs of the prompt tokens this step's chunk
        predicts, by request id: the hidden state at prompt position ``p`` scores prompt token
        ``p + 1``. ``states``, ``computed_before`` and ``num_scheduled`` are per request of the
        step, in input order."""
        out: dict[str, list[TokenLogprobs]] = {}
        if all(state.sampling_params.prompt_logprobs is None for state in states):
            return out
        start = 0
        for i, state in enumerate(states):
            n = int(num_scheduled[i])
            k = state.sampling_params.prompt_logprobs
            first = int(computed_before[i])
            num_prompt = len(state.prompt_token_ids)
            last = min(first + n, num_prompt - 1)  # exclusive: positions p with p + 1 < num_prompt
            if k is not None and first < last:
                logits = self.model.compute_logits(hidden[start : start + (last - first)])
                targets = torch.tensor(state.prompt_token_ids[first + 1 : last + 1], dtype=torch.int64, device=logits.device)
                lp = gather_logprobs(logits.float().log_softmax(dim=-1), k, targets)
                lp = LogprobsTensors(lp.token_ids.cpu(), lp.logprobs.cpu(), lp.ranks.cpu())
                out[state.req_id] = [lp.row(j, k) for j in range(last - first)]
            start += n
        return out

    # -- one step, whole -------------------------------------------------------------------------

    @torch.inference_mode()
    def execute_model(self, so: SchedulerOutput, non_blocking: bool = False) -> "ModelRunnerOutput | StepHandle":
        """Run one step through the runner's step kind. With ``non_blocking`` a sampling step
        is launched and its handle returned at once; the handle's ``get_output()`` waits for the
        sampled ids (asynchronous scheduling plans the next step in between). Otherwise, and for
        the other step kinds, the finished output.

        With a KV connector its worker role runs around the step (:mod:`host.core.kv_transfer.worker`), and
        the output carries its report."""
        kv = self.kv_connector
        if kv is None:
            out = self._execute(so, non_blocking)
        else:
            kv.before_forward(so)
            self._attn_metadata = None
            out = self._execute(so, non_blocking)
            kv.after_forward(self._attn_metadata)
            out.kv_connector_output = kv.report()
        if self.eplb_enabled and so.total_num_scheduled_tokens > 0:
            self._eplb_step(out)
        return out

    def _eplb_step(self, out: Any) -> None:
        """--enable-eplb: count this step with the load balancer (built at the first real step, so
        warm-up and profiling forwards record no load) and report its state with the output."""
        if self.eplb is None:
            from host.core.distributed.parallel_state import get_eplb_group
            from host.core.models.registry import eplb_policy
            from host.core.moe.eplb.state import EplbState

            for layer in self.model.moe_layers():
                layer.expert_load.zero_()
            eplb = self.config.parallel.eplb
            self.eplb = EplbState(self.model.moe_layers(), eplb, get_eplb_group(), eplb_policy(eplb.policy))
        self.eplb.step()
        if isinstance(out, ModelRunnerOutput):
            out.eplb_stats = self.eplb.stats()

    def _execute(self, so: SchedulerOutput, non_blocking: bool) -> "ModelRunnerOutput | StepHandle":
        assert self.model is not None and self.attn_backend is not None and self.input_batch is not None
        assert self.step_kind is not None
        return self.step_kind.execute(so, non_blocking)
