"""Attach the compiled CPU kernels (:mod:`host.plugins.builtin_cpu.kernels`) to a model's
layers: RMSNorm (plain and residual-fused), rotary embedding and SiLU-and-mul. Each layer keeps
its torch path for the shapes and dtypes a kernel does not take.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from host.sdk.models import set_layer_kernels

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


def attach_fused_ops(model: nn.Module, kernels: Any) -> int:
    """Give every RMSNorm, RotaryEmbedding and SiluAndMul of ``model`` its compiled kernel
    (float32). Returns how many modules got one."""
    count = set_layer_kernels(
        model, rms_norm=rms_norm_kernel(kernels), silu_and_mul=silu_and_mul_kernel(kernels), rotary=rotary_kernel(kernels)
    )
    logger.info("Attached CPU kernels to %d norm / activation / rotary modules", count)
    return count
