"""Build a model from a :class:`ModelConfig` and fill its weights.

Sources: a Hugging Face directory (``config.json`` + ``*.safetensors``, or ``*.bin`` when no
safetensors exist), a single ``.gguf`` file (config and tensors from its metadata), or
``load_format="dummy"``: random weights from the config alone, for benchmarks.

With a quantization plan (:mod:`host.core.models.quant_plan`) the model is built with quantized
layers; when the plan keeps GGUF blocks, the weights come from the GGUF source with those blocks
as stored (the default model's directory keeps its GGUF as ``model.gguf``), otherwise a GGUF is
dequantized to the model dtype.

The class comes from the plugin host's ``models`` registry (:mod:`host.core.models.registry`),
so a ``host.general`` plugin can add architectures without touching this module, or is the
transformers fallback (``--model-impl``, :mod:`host.core.models.model_impl`).
"""

from __future__ import annotations

import glob
import json
import logging
import os
from typing import Any, Iterator

import torch
from torch import nn

from host.core.config import LoadConfig, ModelConfig
from host.core.models.default_model import resolve_model_path
from host.core.models.gguf_file import BLOCK_CACHE, GGUF_ARCHITECTURES, GGUFCheckpoint, block_cache_for, iter_block_cache
from host.core.models.model_impl import choose_model_class
from host.core.models.quant_linear import quantized_layers, weight_bytes

logger = logging.getLogger("host.models")

_EXPLICIT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# model_type -> architecture, for configs without an ``architectures`` list
_MODEL_TYPE_ARCH = {model_type: arch for model_type, arch in GGUF_ARCHITECTURES.values()}
DEFAULT_MAX_MODEL_LEN = 2048


def is_gguf(path: str) -> bool:
    return path.lower().endswith(".gguf") and os.path.isfile(path)


def load_hf_config(path: str) -> Any:
    """The ``transformers`` config of a model directory or ``.gguf`` file."""
    if is_gguf(path):
        return GGUFCheckpoint(path).hf_config()
    from transformers import AutoConfig

    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(f"{path} has no config.json; pass a Hugging Face model directory or a .gguf file")
    return AutoConfig.from_pretrained(path)


def get_model_architecture(hf_config: Any) -> str:
    """The architecture name used to pick the model class (first of ``architectures``, or the
    one implied by ``model_type`` when the config has no list)."""
    architectures = getattr(hf_config, "architectures", None) or []
    if architectures:
        return architectures[0]
    model_type = getattr(hf_config, "model_type", None)
    if model_type in _MODEL_TYPE_ARCH:
        return _MODEL_TYPE_ARCH[model_type]
    raise ValueError(
        f"the model config has no 'architectures' list and model_type={model_type!r} implies none; "
        "add \"architectures\": [\"...ForCausalLM\"] to config.json"
    )


def max_model_len(hf_config: Any) -> int:
    """The longest sequence the model supports, from its config: ``max_position_embeddings``
    (or an older equivalent field); 2048 when the config has none."""
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = getattr(hf_config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return DEFAULT_MAX_MODEL_LEN


def _config_dtype(hf_config: Any) -> torch.dtype | None:
    value = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(value, str):
        value = _EXPLICIT_DTYPES.get(value)
    return value if isinstance(value, torch.dtype) else None


def resolve_dtype(dtype: str, hf_config: Any, device: str | torch.device) -> torch.dtype:
    """The torch dtype for ``ModelConfig.dtype``.

    ``auto`` is float32 on CPU (CPU bf16 matmuls are slow and tests compare against fp32
    references). On an accelerator it is bfloat16 when the config says bfloat16 or float16
    (float16 is mapped to bfloat16: same memory, no overflow risk), else float32.
    """
    if dtype in _EXPLICIT_DTYPES:
        return _EXPLICIT_DTYPES[dtype]
    if dtype != "auto":
        raise ValueError(f"dtype={dtype!r} is not supported; use auto, float32, bfloat16 or float16")
    if torch.device(device).type == "cpu":
        return torch.float32
    if _config_dtype(hf_config) in (torch.bfloat16, torch.float16):
        return torch.bfloat16
    return torch.float32


def iter_hf_weights(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs of a Hugging Face directory: its safetensors files (those in
    ``model.safetensors.index.json`` when present), else its ``pytorch_model*.bin`` files."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted({os.path.join(path, name) for name in json.load(f)["weight_map"].values()})
    else:
        # every safetensors file but a GGUF block cache (the same weights, still quantized)
        files = sorted(f for f in glob.glob(os.path.join(path, "*.safetensors")) if os.path.basename(f) != BLOCK_CACHE)
    if files:
        from safetensors import safe_open

        for file in files:
            with safe_open(file, framework="pt", device="cpu") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        return
    bins = sorted(glob.glob(os.path.join(path, "pytorch_model*.bin")))
    if not bins:
        raise ValueError(
            f"{path} holds no *.safetensors or pytorch_model*.bin weights; "
            "use load_format='dummy' for random weights"
        )
    for file in bins:
        yield from torch.load(file, map_location="cpu", weights_only=True).items()


def init_dummy_weights(model: nn.Module, seed: int = 0) -> None:
    """Random weights as a stand-in for a checkpoint: normal(0, 0.02), norm weights 1,
    biases 0, reproducible for a given seed."""
    params = sorted(model.named_parameters(), key=lambda item: item[0])
    device = params[0][1].device if params else torch.device("cpu")
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in params:
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                param.normal_(0.0, 0.02, generator=generator)


def load_model(
    model_config: ModelConfig,
    load_config: LoadConfig,
    attn_backend: type | None,
    device: str | torch.device = "cpu",
    quant_plan: Any = None,
    parallel_config: Any = None,
) -> tuple[nn.Module, Any]:
    """Build the model ``model_config`` names on ``device`` and load its weights.

    With ``parallel_config`` of more than one rank the model is built for this worker's place
    (``shard``: its tensor-parallel part and pipeline stage, ``--pp-layer-partition`` included).
    A model class taking ``max_model_len`` gets ``model_config.max_model_len`` when it is set.

    Returns ``(model, hf_config)``; the model is in eval mode with gradients off. Also fills
    ``model_config.hf_config``, ``.architecture`` and ``.resolved_path``; a config already there
    for the same resolved path is reused instead of parsed again. ``quant_plan`` (a ``QuantPlan``
    resolved by the engine) builds the quantized layers it names.
    """
    path = resolve_model_path(model_config.model)
    fmt = load_config.load_format
    gguf = is_gguf(path)
    if fmt == "gguf" and not gguf:
        raise ValueError(f"load_format='gguf' needs a .gguf file, got {path}")
    if fmt == "safetensors" and gguf:
        raise ValueError(f"load_format='safetensors' needs a model directory, got the GGUF file {path}")
    reuse_config = model_config.hf_config is not None and model_config.resolved_path == path
    keep_blocks = quant_plan is not None and quant_plan.keeps_gguf_blocks and fmt != "dummy"
    cache = block_cache_for(quant_plan.gguf_path) if keep_blocks else None
    if keep_blocks and cache is None:
        checkpoint = GGUFCheckpoint(quant_plan.gguf_path)
    elif keep_blocks:
        checkpoint = None  # the blocks come from the cache next to the GGUF link
    else:
        checkpoint = GGUFCheckpoint(path) if gguf and not (reuse_config and fmt == "dummy") else None
    if reuse_config:  # already parsed by EngineArgs; opening a GGUF twice costs seconds
        hf_config = model_config.hf_config
    elif checkpoint is not None:
        hf_config = checkpoint.hf_config()
    else:
        hf_config = load_hf_config(path)
    architecture = get_model_architecture(hf_config)
    model_cls, impl, reason = choose_model_class(architecture, model_config.model_impl, hf_config)
    dtype = resolve_dtype(model_config.dtype, hf_config, device)
    bound = None
    if quant_plan is not None and quant_plan.quantized:
        from host.core.models.quant_plan import registered_methods

        bound = quant_plan.bind(registered_methods())
    extra = _shard_kwargs(model_cls, parallel_config)
    if model_config.max_model_len and _accepts(model_cls, "max_model_len"):
        extra["max_model_len"] = model_config.max_model_len  # LongRoPE's factor choice reads it
    with torch.device(device):
        model = model_cls(hf_config, dtype, attn_backend, **extra) if bound is None else _build_quantized(model_cls, hf_config, dtype, attn_backend, bound, **extra)
    with torch.no_grad():
        if fmt == "dummy":
            if bound is not None:
                raise ValueError("load_format='dummy' gives random float weights; it cannot be combined with quantization (use --quantization none)")
            init_dummy_weights(model, model_config.seed)
        elif cache is not None:
            model.load_weights(iter_block_cache(cache, dtype, keep_qtypes=bound.kept_gguf_qtypes()))
        elif checkpoint is not None:
            keep = bound.kept_gguf_qtypes() if keep_blocks else ()
            model.load_weights(checkpoint.tensors(dtype, keep_qtypes=keep))
        else:
            model.load_weights(iter_hf_weights(path))
    model.eval().requires_grad_(False)
    model_config.hf_config = hf_config
    model_config.architecture = architecture
    model_config.resolved_path = path
    model_config.model_impl_used = impl
    quantized = quantized_layers(model)
    schemes = sorted({m.scheme for m in quantized})
    logger.info(
        "loaded %s (%s, %s%s; model implementation: %s, %s) from %s on %s: weights %.1f MiB",
        architecture, fmt, dtype,
        f", {len(quantized)} layers quantized with {'/'.join(schemes)}" if quantized else "", impl, reason,
        cache or (checkpoint.path if checkpoint is not None else path), device, weight_bytes(model) / 2**20,
    )
    return model, hf_config


def _accepts(model_cls: type, keyword: str) -> bool:
    """Whether ``model_cls(...)`` takes ``keyword``."""
    import inspect

    return keyword in inspect.signature(model_cls.__init__).parameters


def _shard_kwargs(model_cls: type, parallel_config: Any) -> dict[str, Any]:
    """``{"shard": ModelShard}`` for a model built on one rank of several (or with EPLB's
    redundant experts), else nothing."""
    if parallel_config is None:
        return {}
    redundant = parallel_config.eplb.num_redundant_experts if parallel_config.enable_eplb else 0
    if parallel_config.distributed_world_size == 1:
        if not redundant or not _accepts(model_cls, "shard"):
            return {}
        from host.core.models.parallel_layers import ModelShard

        return {"shard": ModelShard(num_redundant_experts=redundant)}
    if not _accepts(model_cls, "shard"):
        raise ValueError(
            f"model class {model_cls.__name__} takes no shard, so it cannot run with -tp/-pp above 1; "
            "use -tp 1 -pp 1, or give it a shard keyword and tensor-parallel layers as LlamaForCausalLM has"
        )
    from host.core.models.parallel_layers import ModelShard

    return {"shard": ModelShard.current(
        parallel_config.pp_layer_partition, expert_parallel=parallel_config.enable_expert_parallel,
        num_redundant_experts=redundant,
    )}


def _build_quantized(model_cls: type, hf_config: Any, dtype: torch.dtype, attn_backend: Any, bound: Any, **extra: Any) -> nn.Module:
    try:
        return model_cls(hf_config, dtype, attn_backend, quant_plan=bound, **extra)
    except TypeError as exc:
        if "quant_plan" not in str(exc):
            raise
        raise ValueError(
            f"model class {model_cls.__name__} takes no quant_plan, so it cannot be quantized; "
            "use --quantization none, or build its linear layers with host.sdk.models.make_linear"
        ) from None
