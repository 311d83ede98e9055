"""Linear layers with weights repacked once for oneDNN's CPU GEMM.

``torch.nn.functional.linear`` on a plain ``[out, in]`` weight runs at roughly half the
machine's GEMM speed for the wide projections of a decode batch (qkv, gate/up, the LM head)
on the 2-core AVX2 machines we benchmark on; the same product with the weight reordered into
oneDNN's blocked layout reaches 60-75 GFLOP/s at every batch size we measured. The result
differs from ``F.linear`` only by floating-point summation order.
"""

from __future__ import annotations

import logging

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

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, batch_hint: int) -> None:
        super().__init__()
        self.in_features = weight.shape[1]
        self.out_features = weight.shape[0]
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), batch_hint)
        self.register_buffer("packed_weight", packed, persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach().clone(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, shape[-1]), self.packed_weight, self.bias, "none", [], "")
        return y.view(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def pack_model_linears(model: nn.Module, batch_hint: int) -> int:
    """Replace every ``nn.Linear`` of ``model`` by a :class:`PackedLinear`, and give the model a
    packed ``logits_head`` for its LM head. Returns how many layers were packed."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and packing_supported(child.weight.dtype):
                setattr(parent, name, PackedLinear(child.weight, child.bias, batch_hint))
                count += 1
    lm_head = getattr(model, "lm_head", None)
    weight = getattr(lm_head, "weight", None) if lm_head is not None else None
    if isinstance(lm_head, PackedLinear):
        model.logits_head = lm_head
    elif isinstance(weight, torch.Tensor) and packing_supported(weight.dtype):
        model.logits_head = PackedLinear(weight, None, batch_hint)
        count += 1
    logger.info("Packed %d linear layers for oneDNN", count)
    return count
