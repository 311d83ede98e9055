"""Engine arguments: the flat set of user flags (CLI ``--max-num-seqs`` = keyword
``max_num_seqs``) and their resolution into an :class:`EngineConfig`.

Each field is declared once, with :func:`flag`: its default, its help text and how the command
line offers it. ``host serve``, ``host generate`` and ``host chat`` build their engine options
from these fields (``host.core.entrypoints.cli.engine_flags``), and the flag table of
``docs/engine.md`` is generated from them (a test keeps the two equal).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from host.core.config import (
    DTYPE_ALIASES,
    DTYPES,
    KV_CACHE_DTYPES,
    LOAD_FORMATS,
    MODEL_IMPLS,
    QUANTIZED_ACTIVATIONS,
    SCHEDULING_POLICIES,
    CacheConfig,
    CompilationConfig,
    EngineConfig,
    EPLBConfig,
    KVTransferConfig,
    LoadConfig,
    LoRAConfig,
    ModelConfig,
    ParallelConfig,
    QuantizationConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from host.core.config.flags import flag
from host.core.pooling.config import CONVERTS, RUNNERS, check_pooling_support, resolve_runner

logger = logging.getLogger("host.engine")


def _platform_dtype(dtype: str, platform: Any) -> str:
    """``dtype``, or — for a float16 the platform cannot compute in (the CPU), as a vLLM script's
    ``--dtype half`` asks — bfloat16 (same memory, wider range) or else float32, with a warning:
    a user would rather run than be refused. Other unsupported dtypes stay, for the platform's
    own error."""
    supported = list(getattr(platform, "supported_dtypes", []) or [])
    if dtype != "float16" or not supported or dtype in supported:
        return dtype
    chosen = "bfloat16" if "bfloat16" in supported else "float32"
    logger.warning(
        "dtype float16 is not supported on the %s platform (it computes in %s): running in %s instead",
        platform.name, ", ".join(supported), chosen,
    )
    return chosen


def _quantization_config(quantization: str | None, extra: dict | None, activations: str = "none") -> QuantizationConfig:
    extra = dict(extra or {})
    unknown = sorted(set(extra) - {"ignore", "targets"})
    if unknown:
        raise ValueError(
            f"quantization_config keys {', '.join(unknown)} are not known; use "
            '{"ignore": [layer patterns], "targets": {pattern: method}}'
        )
    return QuantizationConfig(quantization, list(extra.get("ignore", [])), dict(extra.get("targets", {})), activations)


@dataclass
class EngineArgs:
    """Every engine flag, with the defaults ``host generate`` / ``LLM(...)`` use."""

    model: str | None = flag(
        help="HF model directory, .gguf file, or Hugging Face Hub id ORG/NAME (ORG/NAME:FILE.gguf for one GGUF file)",
        short="-m", default_text="SmolLM2-135M-Instruct",
    )
    revision: str | None = flag(help="Hub revision (branch, tag or commit) of an ORG/NAME model", default_text="main")
    download_dir: str | None = flag(help="Hugging Face cache folder for ORG/NAME models", default_text="HF_HOME's hub cache")
    gguf_file: str | None = flag(
        help="the one .gguf file to serve from an ORG/NAME repository or a local folder (as ORG/NAME:FILE.gguf)",
        default_text="none: safetensors",
    )
    tokenizer: str | None = flag(help="tokenizer directory or Hugging Face Hub id ORG/NAME", default_text="the model's")
    tokenizer_revision: str | None = flag(help="Hub revision of an ORG/NAME --tokenizer", default_text="main")
    skip_tokenizer_init: bool = flag(False, help="token ids in and out, no tokenizer", cli=False)
    dtype: str = flag(
        "auto", choices=DTYPES,
        help="weight and activation dtype (auto: float32 on CPU, bfloat16 on GPUs for 16-bit checkpoints; "
        "half = float16, float = float32; float16 where the platform lacks it: bfloat16 with a warning)",
    )
    max_model_len: int | None = flag(help="longest prompt + output, in tokens", default_text="model's, at most 8192")
    seed: int = flag(0, help="seed of the worker's torch RNG and of dummy weights")
    served_model_name: str | None = flag(
        help="the name clients use (host serve --served-model-name, repeatable)", cli=False,
        default_text="the model as typed; the default model: HuggingFaceTB/SmolLM2-135M-Instruct",
    )
    max_logprobs: int = flag(
        20, help="most logprobs a request may ask for (logprobs, top_logprobs, prompt_logprobs); -1: no limit"
    )
    load_format: str = flag("auto", help="how weights are read (dummy: random weights)", choices=LOAD_FORMATS)
    model_impl: str = flag(
        "auto", choices=MODEL_IMPLS,
        help="host: the native implementation; transformers: the installed transformers' *ForCausalLM class "
        "inside host's engine (docs/transformers_fallback.md); auto: native when there is one, else transformers",
    )
    runner: str = flag(
        "auto", choices=RUNNERS,
        help="generate text, or pool prompts into vectors (embeddings); auto: pooling for encoders (BertModel) "
        "and with --convert embed (docs/pooling.md)",
    )
    convert: str = flag(
        "auto", choices=CONVERTS,
        help="embed: run a decoder (*ForCausalLM) as an embedding model, its final hidden states pooled",
    )
    pooler_config: dict | None = flag(
        help='the pooler as JSON, e.g. {"pooling_type": "MEAN", "normalize": true}; pooling_type: MEAN, CLS or LAST',
        parse="json", default_text="the model's sentence-transformers config, else CLS (encoders) / LAST, normalized",
    )
    quantization: str | None = flag(
        help="weight quantization method: a registered host.quantization method (built in: gguf, int8, fp8) or none",
        short="-q", parse="quantization",
        default_text="the checkpoint's: its quantization_config, a GGUF's blocks kept as stored, else none",
    )
    quantization_config: dict | None = flag(
        help='per-layer quantization as JSON: {"ignore": [layer patterns], "targets": {pattern: method}}',
        parse="json", default_text="every layer uses the method",
    )
    quantized_activations: str = flag(
        "none", choices=QUANTIZED_ACTIVATIONS,
        help="quantize activations on the fly (q8: int8 blocks of 32 with a float32 scale, integer dot products; "
        "the gguf method's CPU kernels; opt-in, slightly less accurate)",
    )
    block_size: int = flag(16, help="tokens per KV block")
    enable_prefix_caching: bool = flag(True, help="reuse cached prompt blocks")
    kv_cache_memory: int | None = flag(help="KV cache budget in bytes (1GiB, 512MiB on the command line)", parse="bytes")
    gpu_memory_utilization: float = flag(0.9, help="fraction of device memory the engine may use")
    kv_cache_dtype: str = flag(
        "auto", choices=KV_CACHE_DTYPES,
        help="KV cache element type (auto: the model dtype; fp8 = fp8_e4m3: float8_e4m3fn pages with a per-layer scale, half the bytes of bfloat16)",
    )
    num_gpu_blocks_override: int | None = flag(help="fix the number of KV blocks (tests)")
    disable_hybrid_kv_cache_manager: bool = flag(
        False,
        help="one KV cache group for models mixing full-attention and sliding-window layers: every layer "
        "keeps every token's KV (the window still applies to the computation); by default sliding-window "
        "groups free the blocks their window has left (docs/hybrid_kv_cache.md)",
    )
    max_num_seqs: int = flag(128, help="requests per step")
    max_num_batched_tokens: int | None = flag(
        help="token budget per step", default_text="2048 (chunked prefill off: max_model_len if larger)"
    )
    enable_chunked_prefill: bool = flag(True, help="split long prompts across steps")
    long_prefill_token_threshold: int = flag(0, help="most prompt tokens of one request per step (0: no cap)")
    scheduling_policy: str = flag("fcfs", help="order of waiting requests", choices=SCHEDULING_POLICIES)
    attention_backend: str | None = flag(
        help="force a registered attention backend by name (host plugins list --all shows them)",
        default_text="platform's choice",
    )
    tensor_parallel_size: int = flag(1, short="-tp", help="worker ranks each layer's weights are split over (tensor parallelism)")
    pipeline_parallel_size: int = flag(1, short="-pp", help="pipeline stages the layers are split over, one worker group each")
    data_parallel_size: int = flag(
        1, short="-dp", help="engine replicas behind one front end, each with its own workers; requests balanced by load"
    )
    pp_layer_partition: list[int] | None = flag(
        help="layers per pipeline stage, e.g. 10,14 for -pp 2", parse="int_list", default_text="as even as possible"
    )
    enable_expert_parallel: bool = flag(
        False, help="mixture-of-experts models: split whole experts over the tensor-parallel ranks (and the -dp engines) instead of each expert (docs/moe.md)"
    )
    enable_eplb: bool = flag(
        False, help="mixture-of-experts models: rebalance experts over the ranks by their recorded load (docs/moe.md)"
    )
    eplb_config: dict | None = flag(
        help='the load balancer as JSON, e.g. {"window_size": 1000, "step_interval": 3000, "num_redundant_experts": 2, '
        '"log_balancedness": true}; also use_async, policy, min_improvement (docs/moe.md)',
        parse="json", default_text="window 1000, interval 3000, no redundant experts",
    )
    distributed_executor_backend: str | None = flag(
        help="the registered executor (host.executors) that drives one engine's workers: uniproc, mp, ray",
        default_text="uniproc for one worker, mp for more",
    )
    kv_transfer_config: dict | None = flag(
        help='the KV connector as JSON with vLLM\'s keys, e.g. {"kv_connector": "p2p", "kv_role": "kv_consumer"}; '
        "kv_connector: shared_storage, p2p or a registered one; kv_role: kv_producer, kv_consumer or kv_both; "
        "kv_connector_extra_config: the connector's settings; kv_load_failure_policy: recompute or fail (docs/kv_transfer.md)",
        parse="json", default_text="no KV connector",
    )
    speculative_config: dict | None = flag(
        help='speculative decoding as JSON with vLLM\'s keys, e.g. {"method": "ngram", "num_speculative_tokens": 4}; '
        "method: ngram, draft_model or eagle (docs/speculative.md)",
        parse="json", default_text="no speculation",
    )
    enable_lora: bool = flag(False, help="serve LoRA adapters (PEFT directories) on the base model (docs/lora.md)")
    max_loras: int = flag(1, help="with --enable-lora: most distinct adapters in one step (the device slots)")
    max_lora_rank: int = flag(16, help="with --enable-lora: the largest adapter rank accepted")
    max_cpu_loras: int | None = flag(
        help="with --enable-lora: adapters kept in CPU memory behind the device slots (>= --max-loras)",
        default_text="--max-loras",
    )
    optimization_level: int = flag(2, help="0 (eager) to 3; see docs/cuda.md", short="-O")
    enforce_eager: bool = flag(False, help="no device graphs and no torch.compile, whatever the -O level")
    custom_ops: bool | None = flag(help="the platform's fused kernels", default_text="on from -O1")
    torch_compile: bool | None = flag(help="torch.compile the model", default_text="on at -O3")
    cuda_graphs: bool | None = flag(
        help="capture decode graphs (the command line: --cuda-graph-sizes none)", cli=False,
        default_text="on from -O2 where the platform can capture",
    )
    cuda_graph_sizes: list[int] | None = flag(
        help="decode batch sizes to capture as graphs, e.g. 1,2,4,8; none turns graphs off", parse="graph_sizes",
        default_text="1, 2, 4, 8, then every 16 up to max_num_seqs",
    )
    async_scheduling: bool | None = flag(
        help="plan each step while the previous one runs", default_text="on for GPUs, off on the CPU"
    )

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
        from host.core.models.default_model import resolve_model_path, resolve_tokenizer_path, served_name
        from host.core.models.loader import get_model_architecture, load_hf_config, max_model_len, resolve_dtype
        from host.core.models.model_impl import check_model_impl
        from host.core.plugins.manager import get_plugin_host
        from host.core.plugins.platform import current_platform

        platform = current_platform()
        if platform.name == "unspecified":
            raise RuntimeError("no platform detected this machine's hardware; see `host platform`")
        path = resolve_model_path(self.model, revision=self.revision, download_dir=self.download_dir, gguf_file=self.gguf_file)
        hf_config = load_hf_config(path)
        dtype = str(resolve_dtype(DTYPE_ALIASES.get(self.dtype, self.dtype), hf_config, platform.device_type)).replace("torch.", "")
        dtype = _platform_dtype(dtype, platform)
        model_max = max_model_len(hf_config)
        if self.max_model_len is not None and self.max_model_len > model_max:
            raise ValueError(
                f"max_model_len={self.max_model_len} exceeds the model's limit of {model_max} "
                f"(max_position_embeddings); use --max-model-len {model_max} or less"
            )
        ctx_len = self.max_model_len or min(model_max, 8192)
        runner, pooler = resolve_runner(self.runner, self.convert, get_model_architecture(hf_config), path, self.pooler_config)
        pooling = runner == "pooling"  # one step per prompt: no chunks, no prefix hits, no async steps
        chunked = self.enable_chunked_prefill and not pooling
        batched = self.max_num_batched_tokens
        if batched is None:
            batched = 2048 if chunked else max(ctx_len, 2048)
        if not chunked and not pooling and batched < ctx_len:
            raise ValueError(
                f"max_num_batched_tokens={batched} is smaller than max_model_len={ctx_len} with chunked "
                "prefill off, so long prompts could never be scheduled; raise --max-num-batched-tokens "
                "or enable chunked prefill"
            )
        model_cfg = ModelConfig(
            model=path,
            tokenizer=resolve_tokenizer_path(self.tokenizer, self.tokenizer_revision, self.download_dir) if self.tokenizer else path,
            dtype=dtype,
            max_model_len=ctx_len,
            seed=self.seed,
            served_model_name=self.served_model_name or served_name(self.model),
            max_logprobs=self.max_logprobs,
            runner=runner,
            pooler=pooler,
            model_impl=self.model_impl,
            hf_config=hf_config,
            architecture=get_model_architecture(hf_config),
            resolved_path=path,
        )
        config = EngineConfig(
            model=model_cfg,
            load=LoadConfig(self.load_format),
            cache=CacheConfig(
                block_size=self.block_size,
                enable_prefix_caching=self.enable_prefix_caching and not pooling,
                kv_cache_memory=self.kv_cache_memory,
                gpu_memory_utilization=self.gpu_memory_utilization,
                num_gpu_blocks_override=self.num_gpu_blocks_override,
                cache_dtype=self.kv_cache_dtype,
                disable_hybrid_kv_cache_manager=self.disable_hybrid_kv_cache_manager,
            ),
            scheduler=SchedulerConfig(
                max_num_seqs=self.max_num_seqs,
                max_num_batched_tokens=batched,
                max_model_len=ctx_len,
                enable_chunked_prefill=chunked,
                whole_prompts=pooling,
                long_prefill_token_threshold=self.long_prefill_token_threshold,
                policy=self.scheduling_policy,
                async_scheduling=not pooling and (self.async_scheduling if self.async_scheduling is not None else platform.device_type != "cpu"),
            ),
            parallel=ParallelConfig(
                tensor_parallel_size=self.tensor_parallel_size,
                pipeline_parallel_size=self.pipeline_parallel_size,
                data_parallel_size=self.data_parallel_size,
                pp_layer_partition=self.pp_layer_partition,
                distributed_executor_backend=self.distributed_executor_backend,
                enable_expert_parallel=self.enable_expert_parallel,
                enable_eplb=self.enable_eplb,
                eplb=EPLBConfig.from_value(self.eplb_config),
            ),
            quant=_quantization_config(self.quantization, self.quantization_config, self.quantized_activations),
            kv_transfer=KVTransferConfig.from_value(self.kv_transfer_config),
            speculative=SpeculativeConfig.from_value(self.speculative_config),
            lora=LoRAConfig(self.max_loras, self.max_lora_rank, self.max_cpu_loras) if self.enable_lora else None,
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
        check_model_impl(config)  # the implementation, and what the fallback refuses
        if config.speculative is not None:
            from host.core.spec_decode.scheduler import check_speculative_support

            check_speculative_support(config, async_explicit=self.async_scheduling is not None)
        check_pooling_support(config)
        if config.lora is not None:
            from host.core.lora.engine import check_lora_support

            check_lora_support(config)
        if config.parallel.world_size > 1:  # a split the model cannot take fails here, before workers start
            from host.core.models.parallel_layers import check_model_parallel

            check_model_parallel(hf_config, config.parallel)
        host = get_plugin_host()
        host.call_each("host_adjust_config", config=config)
        config.compilation.resolve(config.scheduler.max_num_seqs, platform.can_capture_graphs())
        platform.check_and_update_config(config)
        logger.info("compilation: %s", config.compilation.describe())
        return config
