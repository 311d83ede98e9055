"""Choosing the attention backend: capability matching, then plugin choice, then platform."""

from __future__ import annotations

import logging
from typing import Any

import torch

from host.core.config import EngineConfig
from host.core.plugins.manager import get_plugin_host
from host.interfaces.attention import AttentionBackend, AttentionRequirements

logger = logging.getLogger("host.attention")


def config_sliding_window(hf_config: Any) -> int | None:
    """The sliding window some layer of this model uses, else ``None``: ``sliding_window`` unless
    ``use_sliding_window`` is false or ``layer_types`` marks no layer ``sliding_attention``
    (Mistral and Phi-3 configs set only ``sliding_window``, Qwen2 ``use_sliding_window`` too,
    Ministral and Gemma-style configs ``layer_types``)."""
    window = getattr(hf_config, "sliding_window", None)
    if not window or getattr(hf_config, "use_sliding_window", True) is False:
        return None
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types and "sliding_attention" not in layer_types:
        return None
    return int(window)


def config_attention_sinks(hf_config: Any) -> bool:
    """Whether the model's attention layers have learned sink logits: the native class of the
    config's architecture says so (``attention_sinks = True``, gpt-oss); an architecture no
    plugin registers natively has none."""
    from host.core.models.registry import resolve_model_class

    architectures = getattr(hf_config, "architectures", None)
    if not architectures:
        return False
    try:
        cls = resolve_model_class(list(architectures))
    except ValueError:
        return False
    return bool(getattr(cls, "attention_sinks", False))


def attention_requirements(config: EngineConfig, platform: Any, hf_config: Any, dtype: torch.dtype) -> AttentionRequirements:
    """What the model needs from a backend, read from its config. ``logits_soft_cap`` is the
    config's ``attn_logit_softcapping`` (Gemma 2's; a backend that cannot soft-cap is then not a
    candidate); ``sinks`` is :func:`config_attention_sinks` (gpt-oss)."""
    head_size = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    window = config_sliding_window(hf_config)
    soft_cap = getattr(hf_config, "attn_logit_softcapping", None)
    return AttentionRequirements(
        device_type=platform.device_type,
        dtype=str(dtype).replace("torch.", ""),
        head_size=int(head_size),
        block_size=config.cache.block_size,
        kv_cache_dtype=config.cache.cache_dtype,
        sliding_window=window,
        logits_soft_cap=float(soft_cap) if soft_cap else None,
        sinks=config_attention_sinks(hf_config),
    )


def select_attention_backend(config: EngineConfig, platform: Any, hf_config: Any, dtype: torch.dtype) -> type[AttentionBackend]:
    """The backend class for this model on this platform.

    ``--attention-backend NAME`` forces one (an error says why it does not fit); otherwise the
    candidates are the registered backends whose capabilities fit, a ``host_select_attention_
    backend`` plugin may pick among them, and else the platform's priority order decides.
    """
    host = get_plugin_host()
    registry: dict[str, type[AttentionBackend]] = host.registry("attention_backends")
    req = attention_requirements(config, platform, hf_config, dtype)
    if config.attention_backend:
        cls = registry.get(config.attention_backend)
        if cls is None:
            raise ValueError(
                f"--attention-backend {config.attention_backend!r} is not registered; "
                f"registered backends: {', '.join(sorted(registry)) or 'none'}"
            )
        reasons = {name: other.supports_combination(req) for name, other in registry.items()}
        if reasons[config.attention_backend]:
            fits = sorted(n for n, r in reasons.items() if r is None)
            raise ValueError(
                f"--attention-backend {config.attention_backend!r} cannot run this model: "
                f"{reasons[config.attention_backend]}; backends that fit: {', '.join(fits) or 'none'} "
                f"(registered: {', '.join(sorted(registry))})"
            )
        return cls
    reasons = {name: cls.supports_combination(req) for name, cls in registry.items()}
    candidates = [registry[n] for n, r in reasons.items() if r is None]
    if not candidates:
        detail = "; ".join(r for r in reasons.values() if r) or "no attention backend is registered"
        raise ValueError(f"no attention backend fits {req}: {detail}")
    chosen = host.pm.hook.host_select_attention_backend(platform=platform, requirements=req, candidates=candidates)
    name = chosen or platform.get_attn_backend_name(req, candidates)
    if name not in registry:
        raise ValueError(f"attention backend {name!r} chosen by a plugin is not registered")
    logger.info("Attention backend: %s (candidates: %s)", name, ", ".join(c.name for c in candidates))
    return registry[name]
