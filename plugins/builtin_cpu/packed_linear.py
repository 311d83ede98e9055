"""Linear layers with weights repacked once for oneDNN's CPU GEMM.

``torch.nn.functional.linear`` on a plain ``[out, in]`` weight runs at roughly half the
machine's GEMM speed for the wide projections of a decode batch (qkv, gate/up, the LM head)
on the 2-core AVX2 machines we benchmark on; the same product with the weight reordered into
oneDNN's blocked layout reaches 60-75 GFLOP/s at every batch size we measured. The result
differs from ``F.linear`` only by floating-point summation order.

For a few rows (batch-1 and small-batch decode) oneDNN's GEMM is far from the bandwidth the
weights could stream at, so when the compiled CPU kernels are available a
:class:`PackedLinear` also keeps the plain ``[out, in]`` weight and sends inputs of at most
``small_m_rows`` rows to ``linear_small_m`` (20.8 vs 13.3 GB/s over SmolLM2-135M's weights at
one row). That costs a second copy of the linear weights, so :func:`pack_model_linears` only
does it while the copy fits ``small_m_budget_bytes``.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch
from torch import nn

logger = logging.getLogger("host.cpu")


def packing_supported(dtype: torch.dtype) -> bool:
    return (
        dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


class PackedLinear(nn.Module):
    """``y = x @ W^T + b`` with ``W`` held in oneDNN's packed layout."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        batch_hint: int,
        small_m_kernel: Callable[..., torch.Tensor] | None = None,
        small_m_rows: int = 0,
    ) -> None:
        super().__init__()
        self.in_features = weight.shape[1]
        self.out_features = weight.shape[0]
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), batch_hint)
        self.register_buffer("packed_weight", packed, persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach().clone(), persistent=False)
        self.small_m_kernel = small_m_kernel if small_m_rows > 0 else None
        self.small_m_rows = small_m_rows
        plain = None
        if self.small_m_kernel is not None:
            from host.plugins.builtin_cpu.kernels import block_weight

            plain = block_weight(weight.detach())
        # the weight in the small-batch kernel's layout ([N/4, K/8, 4, 8] blocks when it divides)
        self.register_buffer("plain_weight", plain, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if self.small_m_kernel is not None and x2.shape[0] <= self.small_m_rows and x2.stride(-1) == 1:
            y = self.small_m_kernel(x2, self.plain_weight, self.bias)
        else:
            y = torch.ops.mkldnn._linear_pointwise(x2, self.packed_weight, self.bias, "none", [], "")
        return y.view(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def pack_model_linears(
    model: nn.Module,
    batch_hint: int,
    small_m_kernel: Callable[..., torch.Tensor] | None = None,
    small_m_rows: int = 8,
    small_m_budget_bytes: int = 0,
) -> int:
    """Replace every ``nn.Linear`` of ``model`` by a :class:`PackedLinear`, and give the model a
    packed ``logits_head`` for its LM head. Returns how many layers were packed.

    With ``small_m_kernel``, inputs of up to ``small_m_rows`` rows use it on a plain copy of the
    weights, provided all those copies together fit in ``small_m_budget_bytes``."""
    linears = [
        (parent, name, child)
        for parent in list(model.modules())
        for name, child in list(parent.named_children())
        if isinstance(child, nn.Linear) and packing_supported(child.weight.dtype)
    ]
    lm_head = getattr(model, "lm_head", None)
    head_weight = getattr(lm_head, "weight", None) if lm_head is not None else None
    pack_head = not isinstance(lm_head, nn.Linear) and isinstance(head_weight, torch.Tensor) and packing_supported(head_weight.dtype)
    copy_bytes = sum(c.weight.numel() * c.weight.element_size() for _, _, c in linears)
    if pack_head:
        copy_bytes += head_weight.numel() * head_weight.element_size()
    rows = small_m_rows if small_m_kernel is not None and copy_bytes <= small_m_budget_bytes else 0
    if small_m_kernel is not None and rows == 0:
        logger.info(
            "Small-batch linear kernel off: a plain weight copy needs %.0f MiB, over the %.0f MiB budget",
            copy_bytes / 2**20, small_m_budget_bytes / 2**20,
        )
    count = 0
    for parent, name, child in linears:
        setattr(parent, name, PackedLinear(child.weight, child.bias, batch_hint, small_m_kernel, rows))
        count += 1
    lm_head = getattr(model, "lm_head", None)
    if isinstance(lm_head, PackedLinear):
        model.logits_head = lm_head
    elif pack_head:
        model.logits_head = PackedLinear(head_weight, None, batch_hint, small_m_kernel, rows)
        count += 1
    logger.info("Packed %d linear layers for oneDNN%s", count, f" (small-batch kernel up to {rows} rows)" if rows else "")
    return count
