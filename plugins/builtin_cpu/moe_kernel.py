"""The CPU platform's fused MoE experts in the kernel table (op ``fused_moe``, device ``"cpu"``).

The compiled ``fused_moe`` (csrc/fused_moe.cpp) takes the op's float32 calls: one call per
layer sorts the token-choices by expert and streams each expert's weights once over all its
tokens, gate and up computed side by side with the activation applied in the same pass, the
down projection scaled by the routing weight, each token's choices summed in ascending expert
order. Other dtypes go to the core's reference (``torch_sorted``, registered under ``"*"``).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from host.sdk.kernels import ANY_DEVICE, kernel_entry

OP = "fused_moe"
ACTIVATION_CODES = {"silu": 0, "gelu": 1, "swigluoai": 2}


def fused_moe_kernel(kernels: Any) -> Callable[..., torch.Tensor]:
    """The kernel-table implementation around the compiled module ``kernels``."""

    def run(
        x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
        activation: str, w13_bias: Optional[torch.Tensor], w2_bias: Optional[torch.Tensor], alpha: float, limit: float,
    ) -> torch.Tensor:
        if x.dtype != torch.float32 or w13.dtype != torch.float32 or activation not in ACTIVATION_CODES:
            return kernel_entry(OP, ANY_DEVICE).impl(x, w13, w2, topk_weights, topk_ids, activation, w13_bias, w2_bias, alpha, limit)
        return kernels.fused_moe(
            x, w13, w2, topk_weights.float(), topk_ids.to(torch.int32), ACTIVATION_CODES[activation], w13_bias, w2_bias,
            float(alpha), float(limit),
        )

    return run


def offer_moe_kernel(kernels: Any, register: Callable[..., None], name: str, reason: str, *, priority: int) -> None:
    register(OP, "cpu", fused_moe_kernel(kernels), name=name, priority=priority,
             reason=f"{reason}: experts sorted, each streamed once, gate/up and activation in one pass")
