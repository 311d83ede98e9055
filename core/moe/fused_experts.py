"""The fused experts op (worker): every token through its chosen experts in one call.

``host_moe::fused_experts(x, w13, w2, topk_weights, topk_ids, activation, w13_bias, w2_bias,
alpha, limit) -> out`` computes, for every token ``t`` and each of its ``k`` choices
``e = topk_ids[t, j]`` (a LOCAL expert slot; ``-1``: the expert lives on another rank, skip)::

    h = x[t] @ w13[e]^T (+ w13_bias[e])            # [2I]: gate rows then up rows
    a = act(h[:I], h[I:])                           # silu(g)*u, gelu(g)*u, or gpt-oss's swiglu
    out[t] += topk_weights[t, j] * (a @ w2[e]^T (+ w2_bias[e]))

with ``x [T, H]``, ``w13 [E, 2I, H]``, ``w2 [E, H, I]``, ``topk_weights`` float32 ``[T, k]``,
``topk_ids`` int32 ``[T, k]``. The contributions are added expert by expert in ascending expert
order (the reference models' order). ``activation``: ``silu``, ``gelu`` (tanh-free GELU) or
``swigluoai`` (gpt-oss: ``g = min(g, limit)``, ``u = clamp(u, -limit, limit)``,
``(u + 1) * g * sigmoid(alpha * g)``).

It is a ``torch.library`` custom op with a fake implementation, so ``torch.compile`` traces it as
one node. Its body asks the kernel table (:mod:`host.interfaces.kernels`) for the implementation
of ``fused_moe`` on the input's device type: a platform offers a faster one through
``host_offer_kernels`` (the CPU platform's C++ kernel, Triton's on GPUs); :func:`fused_experts_sorted`
below is the core's reference for every device (``"*"``). It sorts the token-choices by expert
and streams each expert's weights once for all its tokens (two GEMMs per expert hit).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from host.interfaces.kernels import ANY_DEVICE, kernel_for

OP = "fused_moe"
ACTIVATIONS = ("silu", "gelu", "swigluoai")


def check_activation(activation: str) -> str:
    """``activation`` when the fused experts compute it, else a ``ValueError`` naming those that are."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"expert activation {activation!r} is not supported; the fused experts compute {ACTIVATIONS}")
    return activation


def apply_activation(h: torch.Tensor, activation: str, alpha: float, limit: float) -> torch.Tensor:
    """``act(gate, up)`` of the ``[n, 2I]`` gate-then-up rows ``h`` -> ``[n, I]``."""
    gate, up = h.chunk(2, dim=-1)
    if activation == "silu":
        return torch.nn.functional.silu(gate) * up
    if activation == "gelu":
        return torch.nn.functional.gelu(gate) * up
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def fused_experts_sorted(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
    w13_bias: Optional[torch.Tensor],
    w2_bias: Optional[torch.Tensor],
    alpha: float,
    limit: float,
) -> torch.Tensor:
    """The reference (any device): token-choices sorted by expert, each expert hit once."""
    return run_sorted_experts(
        x, topk_weights, topk_ids, w13.shape[0],
        lambda e, xs: torch.nn.functional.linear(xs, w13[e], None if w13_bias is None else w13_bias[e]),
        lambda e, a: torch.nn.functional.linear(a, w2[e], None if w2_bias is None else w2_bias[e]),
        activation, alpha, limit,
    )


def run_sorted_experts(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    num_experts: int,
    gate_up: Callable[[int, torch.Tensor], torch.Tensor],
    down: Callable[[int, torch.Tensor], torch.Tensor],
    activation: str,
    alpha: float,
    limit: float,
) -> torch.Tensor:
    """The sorted references' loop, whatever the weights' format: for each expert hit (ascending),
    ``gate_up(expert, its rows of x) -> [n, 2I]`` (bias included), the activation,
    ``down(expert, a) -> [n, H]`` (bias included), scaled by the routing weights and added to the
    tokens' rows."""
    out = torch.zeros_like(x)
    for expert, rows, weights in expert_groups(topk_ids, topk_weights, num_experts):
        y = down(expert, apply_activation(gate_up(expert, x[rows]), activation, alpha, limit))
        out.index_add_(0, rows, (y * weights[:, None].to(y.dtype)).to(out.dtype))
    return out


def expert_groups(
    topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int
) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """The token-choices sorted by expert: ``(expert, token rows, routing weights)`` for every
    local expert that has tokens, in ascending expert order (``-1`` choices are left out)."""
    num_tokens, top_k = topk_ids.shape
    if num_tokens == 0:
        return []
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat + 1, minlength=num_experts + 1).tolist()  # bucket 0: -1 (not here)
    tokens = order // top_k
    weights = topk_weights.reshape(-1)[order]
    groups = []
    start = counts[0]
    for expert in range(num_experts):
        n = counts[expert + 1]
        if n:
            groups.append((expert, tokens[start : start + n], weights[start : start + n]))
            start += n
    return groups


@torch.library.custom_op("host_moe::fused_experts", mutates_args=())
def fused_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
    w13_bias: Optional[torch.Tensor] = None,
    w2_bias: Optional[torch.Tensor] = None,
    alpha: float = 1.702,
    limit: float = 7.0,
) -> torch.Tensor:
    return kernel_for(OP, x.device.type)(x, w13, w2, topk_weights, topk_ids, activation, w13_bias, w2_bias, alpha, limit)


@fused_experts.register_fake
def _(x, w13, w2, topk_weights, topk_ids, activation, w13_bias=None, w2_bias=None, alpha=1.702, limit=7.0):
    return torch.empty_like(x)


def offer_kernels(register) -> None:
    """Offer the sorted reference for every device (the core's entry, see :mod:`host.core.kernels`)."""
    register(OP, ANY_DEVICE, fused_experts_sorted, name="torch_sorted",
             reason="torch, in the core: token-choices sorted by expert, two GEMMs per expert hit")
