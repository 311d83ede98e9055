"""Whether an engine lays its KV cache out as hybrid groups, decided once from its config and
its layers' specs, the same way by the engine core (sizing, the manager) and every worker (the
KV tensors and block tables).

Hybrid groups are used when the layers are of several kinds with one page size, unless
``--disable-hybrid-kv-cache-manager`` is given, or a feature that assumes one block table per
request is on: a KV connector (it moves one list of block ids per request), a speculative
decoding config (a draft model's layers join the pool, and rejected drafts move a request's
computed tokens back, past blocks a window may have freed), or pipeline parallelism (each stage
would need its own grouping). Those fall back to one group (sliding-window layers allocated
like full attention, computed with their window), with one log line saying why.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from host.core.kv_cache.groups import KVCacheLayout, hybrid_blocker, plan_kv_cache_layout
from host.core.kv_cache.spec import KVCacheSpec

logger = logging.getLogger("host.kv_cache")


def hybrid_unsupported_reason(config: Any) -> str | None:
    """Why ``config`` (an :class:`~host.core.config.EngineConfig`) runs one KV cache group,
    whatever its layers are; ``None`` when hybrid groups are allowed."""
    if getattr(config.cache, "disable_hybrid_kv_cache_manager", False):
        return "--disable-hybrid-kv-cache-manager is set"
    if getattr(config, "kv_transfer", None) is not None:
        return "a KV connector is configured (it moves one block table per request)"
    if getattr(config, "speculative", None) is not None:
        return "speculative decoding is on (a draft model's layers and rolled-back drafts assume one block table)"
    parallel = getattr(config, "parallel", None)
    if parallel is not None and getattr(parallel, "pipeline_parallel_size", 1) > 1:
        return "pipeline parallelism is on (each stage would need its own grouping)"
    return None


def kv_cache_layout(config: Any, specs: Sequence[KVCacheSpec], layers: Sequence[int] | None = None,
                    log: bool = False) -> KVCacheLayout:
    """The KV cache layout of an engine with ``config`` whose KV layers have ``specs``. With
    ``log`` (the engine core) says which one and, for layers of several kinds that stay in one
    group, why."""
    reason = hybrid_unsupported_reason(config)
    layout = plan_kv_cache_layout(specs, layers, hybrid=reason is None)
    if log:
        if layout.frees_windows and not layout.is_hybrid:
            logger.info("Sliding-window KV cache: every layer has a window of %d tokens; blocks it has left are freed",
                        layout.groups[0].spec.sliding_window)
        elif layout.is_hybrid:
            kinds = ", ".join(
                f"{type(g.spec).__name__}" + (f"(window {g.spec.sliding_window})" if hasattr(g.spec, "sliding_window") else "")
                for g in layout.groups
            )
            logger.info("Hybrid KV cache: %d groups of %d layers [%s]", layout.num_groups, layout.group_size, kinds)
        elif reason is not None and hybrid_blocker(specs) is None:
            logger.info("Hybrid KV cache off: %s; sliding-window layers are allocated like full attention", reason)
    return layout
