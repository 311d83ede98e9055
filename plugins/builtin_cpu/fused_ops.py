"""The compiled CPU kernels (:mod:`host.plugins.builtin_cpu.kernels`) for a model's layers:
RMSNorm (plain and residual-fused), rotary embedding and SiLU-and-mul, offered to the kernel
table (``rms_norm``, ``silu_and_mul``, ``rotary_embedding``) through ``host_offer_kernels`` and
attached from it. Each layer keeps its torch path for the shapes and dtypes a kernel does not take.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from host.sdk.models import attach_layer_kernels

logger = logging.getLogger("host.cpu")


def rms_norm_kernel(kernels: Any) -> Callable[..., Any]:
    """The :class:`RMSNorm` kernel contract over the compiled ``rms_norm`` and
    ``fused_add_rms_norm_`` (float32)."""

    def run(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float) -> Any:
        shape = x.shape
        if residual is None:
            if x.stride(-1) != 1:
                x = x.contiguous()
            return kernels.rms_norm(x.reshape(-1, shape[-1]), weight, eps).view(shape)
        if x.is_contiguous() and residual.is_contiguous() and residual.shape == shape:
            kernels.fused_add_rms_norm_(x.view(-1, shape[-1]), residual.view(-1, shape[-1]), weight, eps)
            return x, residual
        residual = x + residual
        return F.rms_norm(residual, weight.shape, weight, eps), residual

    return run


def silu_and_mul_kernel(kernels: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    def run(x: torch.Tensor) -> torch.Tensor:
        return kernels.silu_and_mul(x if x.stride(-1) == 1 else x.contiguous())

    return run


def rotary_kernel(kernels: Any) -> Callable[..., None]:
    def run(x: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor) -> None:
        if positions.dtype != torch.int64 or not positions.is_contiguous():
            positions = positions.to(torch.int64).contiguous()
        kernels.rotary_neox_(x, positions, cache)

    return run


def offer_layer_kernels(kernels: Any, register: Callable[..., None], name: str, reason: str, *, priority: int) -> None:
    """Offer the layer kernels for ``"cpu"`` (float32) through ``register`` (``host_offer_kernels``)."""
    register("rms_norm", "cpu", rms_norm_kernel(kernels), name=name, priority=priority, reason=reason)
    register("silu_and_mul", "cpu", silu_and_mul_kernel(kernels), name=name, priority=priority, reason=reason)
    register("rotary_embedding", "cpu", rotary_kernel(kernels), name=name, priority=priority, reason=reason)


def attach_fused_ops(model: nn.Module) -> int:
    """Give every RMSNorm, RotaryEmbedding and SiluAndMul of ``model`` the kernel the kernel table
    serves on ``"cpu"`` (the compiled ones, unless a plugin offers better). Returns how many
    modules got one."""
    count = attach_layer_kernels(model, "cpu")
    logger.info("Attached CPU kernels to %d norm / activation / rotary modules", count)
    return count
