"""The Triton kernels as ``torch.library`` custom ops (namespace ``host``), each with a fake
(meta) implementation, so ``torch.compile`` traces through them as single opaque nodes and
CUDA-graph capture sees plain op calls.

Ops: ``host::rms_norm``, ``host::fused_add_rms_norm`` (mutates ``residual``),
``host::rotary_neox`` (mutates ``x``), ``host::silu_and_mul``, ``host::reshape_and_cache``
(mutates both caches) and ``host::paged_attention``. :func:`attach_triton_ops` gives a model's
layers these ops as their ``kernel`` hooks (see ``core/models/layers.py``).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch
from torch import nn

from host.plugins.triton_ops import kernels as tk

logger = logging.getLogger("host.cuda")


@torch.library.custom_op("host::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return tk.rms_norm(x.contiguous(), weight, eps)


@rms_norm.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("host::fused_add_rms_norm", mutates_args=("residual",))
def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    out, _ = tk.fused_add_rms_norm(x.contiguous(), residual, weight, eps)
    return out


@fused_add_rms_norm.register_fake
def _(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("host::rotary_neox", mutates_args=("x",))
def rotary_neox(x: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> None:
    tk.rotary_neox(x, positions, cos_sin_cache)


@rotary_neox.register_fake
def _(x: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> None:
    return None


@torch.library.custom_op("host::silu_and_mul", mutates_args=())
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return tk.silu_and_mul(x)


@silu_and_mul.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], x.shape[-1] // 2)


@torch.library.custom_op("host::reshape_and_cache", mutates_args=("k_cache", "v_cache"))
def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    tk.reshape_and_cache(key, value, k_cache, v_cache, slot_mapping)


@reshape_and_cache.register_fake
def _(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    return None


@torch.library.custom_op("host::paged_attention", mutates_args=())
def paged_attention(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, max_query_len: int, scale: float, sliding_window: int,
) -> torch.Tensor:
    return tk.paged_attention(query, k_cache, v_cache, block_table, query_start_loc, seq_lens, max_query_len, scale, sliding_window or None)


@paged_attention.register_fake
def _(query, k_cache, v_cache, block_table, query_start_loc, seq_lens, max_query_len, scale, sliding_window):  # noqa: ANN001
    return torch.empty_like(query)


# -- wiring into a model ------------------------------------------------------------------------


def _norm_kernel(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float) -> Any:
    if residual is None:
        return torch.ops.host.rms_norm(x, weight, eps)
    if not residual.is_contiguous():
        residual = residual.contiguous()
    return torch.ops.host.fused_add_rms_norm(x, residual, weight, eps), residual


def _rotary_kernel(x: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor) -> None:
    torch.ops.host.rotary_neox(x, positions, cache)


def _silu_kernel(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.host.silu_and_mul(x)


LAYER_OP_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
for _kernel in (_norm_kernel, _silu_kernel, _rotary_kernel):
    _kernel.dtypes = LAYER_OP_DTYPES  # type: ignore[attr-defined] - read by attach_layer_kernels


def offer_triton_layer_ops(device_type: str, register: Callable[..., None]) -> None:
    """Offer the Triton custom ops for the layers (``rms_norm``, ``silu_and_mul``,
    ``rotary_embedding``; float32, bfloat16 and float16) to the kernel table for ``device_type``."""
    reason = "Triton custom ops host::rms_norm / silu_and_mul / rotary_neox, traceable by torch.compile"
    for op, impl in (("rms_norm", _norm_kernel), ("silu_and_mul", _silu_kernel), ("rotary_embedding", _rotary_kernel)):
        register(op, device_type, impl, name="triton", priority=10, reason=reason)


def attach_triton_ops(model: nn.Module) -> int:
    """Give every RMSNorm, RotaryEmbedding and SiluAndMul of ``model`` its Triton op (all
    dtypes). Returns how many modules got one."""
    from host.sdk.models import set_layer_kernels

    count = set_layer_kernels(
        model, rms_norm=_norm_kernel, silu_and_mul=_silu_kernel, rotary=_rotary_kernel,
        dtypes=(torch.float32, torch.bfloat16, torch.float16),
    )
    logger.info("Attached Triton ops to %d norm / activation / rotary modules", count)
    return count
