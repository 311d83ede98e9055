"""GGUF experts kept in their blocks: the ``gguf`` method's MoE method and the op it computes with.

:class:`GGUFMoEMethod` owns a :class:`host.core.moe.layer.FusedMoE` layer's experts when the plan
gives the layer ``gguf``. Each expert's gate, up and down matrices stay the file's block rows
(``uint8 [rows, row_bytes]``), stacked per part over the layer's local experts:

- ``layer.gguf_w13 [E, 2I, B]`` (gate rows, then up rows) with ``layer.gguf_w13_qtype``; when the
  file stores gate and up in different block types, ``gguf_w13`` holds the gate rows only and
  ``layer.gguf_w3 [E, I, B']`` the up rows (``layer.gguf_w3_qtype``);
- ``layer.gguf_w2 [E, H, B'']`` with ``layer.gguf_w2_qtype``.

A part the file stores in float (F32/F16/BF16, or a block type outside the kept ones) arrives
dequantized and is kept as a float ``[E, rows, cols]`` tensor with qtype ``F32``; when every part
is float the layer gets plain ``w13``/``w2`` and runs the float ``host_moe::fused_experts``.

Under tensor parallelism each rank keeps its rows of gate/up (whole block rows) and its columns of
down, which must fall on block boundaries (``I / tp`` a multiple of the block size, 32 or 256
values); otherwise use ``--enable-expert-parallel``, which keeps whole experts.

``host_quant::gguf_fused_experts`` computes the experts: the custom op asks the kernel table for
``gguf_fused_moe`` on the input's device; :func:`gguf_fused_experts_sorted`, offered for every
device (``"*"``), sorts the token-choices by expert and runs ``host_quant::gguf_linear`` (the
platform's GGUF kernel: the CPU's C++ kernels on the CPU) once per part on each expert's tokens.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

from host.plugins.quantization import ops
from host.plugins.quantization.gguf_blocks import BLOCKS, F32, NAMES
from host.sdk.kernels import kernel_for
from host.sdk.moe import fused_experts, run_sorted_experts
from host.sdk.quantization import MoEMethod

OP = "gguf_fused_moe"
_PARTS = ("gate", "up", "down")


def _expert_linear(x: torch.Tensor, weight: torch.Tensor, qtype: int, q8: bool) -> torch.Tensor:
    if qtype == F32:
        return F.linear(x, weight.to(x.dtype))
    return (ops.gguf_linear_q8 if q8 else ops.gguf_linear)(x, weight, qtype, None)


def gguf_fused_experts_sorted(
    x: torch.Tensor,
    w13: torch.Tensor,
    w13_qtype: int,
    w3: Optional[torch.Tensor],
    w3_qtype: int,
    w2: torch.Tensor,
    w2_qtype: int,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
    w13_bias: Optional[torch.Tensor],
    w2_bias: Optional[torch.Tensor],
    alpha: float,
    limit: float,
    q8: bool,
) -> torch.Tensor:
    """The reference (any device): token-choices sorted by expert; per expert hit, its tokens
    through ``gguf_linear`` for gate+up (two calls when ``w3`` holds the up rows), the
    activation, then ``gguf_linear`` for down, scaled by the routing weights and summed."""
    def gate_up(expert: int, xs: torch.Tensor) -> torch.Tensor:
        h = _expert_linear(xs, w13[expert], w13_qtype, q8)
        if w3 is not None:
            h = torch.cat([h, _expert_linear(xs, w3[expert], w3_qtype, q8)], dim=-1)
        return h if w13_bias is None else h + w13_bias[expert].to(h.dtype)

    def down(expert: int, a: torch.Tensor) -> torch.Tensor:
        y = _expert_linear(a, w2[expert], w2_qtype, q8)
        return y if w2_bias is None else y + w2_bias[expert].to(y.dtype)

    return run_sorted_experts(x, topk_weights, topk_ids, w13.shape[0], gate_up, down, activation, alpha, limit)


@torch.library.custom_op("host_quant::gguf_fused_experts", mutates_args=())
def gguf_fused_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w13_qtype: int,
    w3: Optional[torch.Tensor],
    w3_qtype: int,
    w2: torch.Tensor,
    w2_qtype: int,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
    w13_bias: Optional[torch.Tensor],
    w2_bias: Optional[torch.Tensor],
    alpha: float,
    limit: float,
    q8: bool,
) -> torch.Tensor:
    """Every token through its chosen GGUF experts -> ``[T, H]`` in x's dtype (see the module)."""
    return kernel_for(OP, x.device.type)(
        x, w13, w13_qtype, w3, w3_qtype, w2, w2_qtype, topk_weights, topk_ids, activation, w13_bias, w2_bias,
        alpha, limit, q8,
    )


@gguf_fused_experts.register_fake
def _(x, w13, w13_qtype, w3, w3_qtype, w2, w2_qtype, topk_weights, topk_ids, activation, w13_bias, w2_bias,
      alpha, limit, q8):
    return torch.empty_like(x)


def register_reference_kernels(register: Callable[..., None]) -> None:
    """Offer the sorted reference for every device (the plugin's ``host_offer_kernels`` calls this)."""
    register(OP, "*", gguf_fused_experts_sorted, name="torch_sorted",
             reason="torch: token-choices sorted by expert, gguf_linear per expert hit")


class GGUFMoEMethod(MoEMethod):
    """A MoE layer's experts in the GGUF file's blocks (see the module for the layout)."""

    def __init__(self, activations: str = "none") -> None:
        self.activations = activations

    def create_weights(self, layer: Any, num_local: int, hidden: int, inter: int, dtype: torch.dtype) -> None:
        layer._gguf_moe_pending = {}
        layer._gguf_device = torch.empty(0).device
        layer.gguf_float = False
        layer._gguf_dtype = dtype

    def load_expert(self, layer: Any, slot: int, part: str, tensor: Any) -> None:
        if part not in _PARTS:
            raise ValueError(f"{layer.layer_name}: GGUF experts load gate, up and down, not {part!r}")
        inter, rank = layer.intermediate_size, layer.split_rank
        lo, hi = rank * inter, (rank + 1) * inter
        quantized = not isinstance(tensor, torch.Tensor) and getattr(tensor, "qtype", None) in BLOCKS
        if quantized:
            qtype = int(tensor.qtype)
            if part == "down":
                data = _block_columns(tensor.data, qtype, tensor.shape[1], lo, hi, layer)
            else:
                data = tensor.data[lo:hi]
            layer._gguf_moe_pending[(slot, part)] = (qtype, data)
            return
        if hasattr(tensor, "dequantize") and not isinstance(tensor, torch.Tensor):
            tensor = tensor.dequantize(torch.float32)
        data = tensor[:, lo:hi] if part == "down" else tensor[lo:hi]
        layer._gguf_moe_pending[(slot, part)] = (F32, data)

    def process_weights_after_loading(self, layer: Any) -> None:
        pending = layer._gguf_moe_pending
        stacked: dict[str, tuple[int, torch.Tensor]] = {}
        for part in _PARTS:
            entries = [pending[(slot, part)] for slot in range(layer.num_local)]
            qtypes = {q for q, _ in entries}
            if len(qtypes) != 1:
                names = ", ".join(NAMES.get(q, "float") for q in sorted(qtypes))
                raise ValueError(
                    f"{layer.layer_name}: the experts' {part} matrices mix block types ({names}); one GGUF "
                    "tensor stacks them all in one type, so the file is malformed"
                )
            stacked[part] = (qtypes.pop(), torch.stack([d for _, d in entries]).contiguous().to(layer._gguf_device))
        del layer._gguf_moe_pending
        (gate_t, gate), (up_t, up), (down_t, down) = stacked["gate"], stacked["up"], stacked["down"]
        if gate_t == up_t == down_t == F32:
            layer.gguf_float = True
            layer.w13 = torch.nn.Parameter(torch.cat([gate, up], dim=1).to(layer._gguf_dtype), requires_grad=False)
            layer.w2 = torch.nn.Parameter(down.to(layer._gguf_dtype), requires_grad=False)
            return
        if gate_t == up_t:
            layer.register_buffer("gguf_w13", torch.cat([gate, up], dim=1), persistent=False)
            layer.gguf_w3, layer.gguf_w3_qtype = None, -1
        else:
            layer.register_buffer("gguf_w13", gate, persistent=False)
            layer.register_buffer("gguf_w3", up, persistent=False)
            layer.gguf_w3_qtype = up_t
        layer.register_buffer("gguf_w2", down, persistent=False)
        layer.gguf_w13_qtype, layer.gguf_w2_qtype = gate_t, down_t

    def slot_tensors(self, layer: Any) -> list[torch.Tensor]:
        """The tensors with one row per local expert slot (the blocks as stored, and the biases):
        what EPLB moves when a slot gets another expert."""
        if layer.gguf_float:
            tensors = [layer.w13.data, layer.w2.data]
        else:
            tensors = [layer.gguf_w13, layer.gguf_w2] + ([layer.gguf_w3] if layer.gguf_w3 is not None else [])
        return tensors + [t.data for t in (layer.w13_bias, layer.w2_bias) if t is not None]

    def apply(self, layer: Any, x: torch.Tensor, weights: torch.Tensor, local_ids: torch.Tensor) -> torch.Tensor:
        if layer.gguf_float:
            return fused_experts(x, layer.w13, layer.w2, weights, local_ids, layer.activation, layer.w13_bias,
                                 layer.w2_bias, layer.alpha, layer.limit)
        return gguf_fused_experts(
            x, layer.gguf_w13, layer.gguf_w13_qtype, layer.gguf_w3, layer.gguf_w3_qtype, layer.gguf_w2,
            layer.gguf_w2_qtype, weights, local_ids, layer.activation, layer.w13_bias, layer.w2_bias, layer.alpha,
            layer.limit, self.activations == "q8",
        )


def _block_columns(data: torch.Tensor, qtype: int, cols: int, lo: int, hi: int, layer: Any) -> torch.Tensor:
    """Columns ``lo:hi`` of block rows ``data`` (of ``cols`` values each), which must be whole blocks."""
    if lo == 0 and hi == cols:
        return data
    size, nbytes = BLOCKS[qtype]
    if lo % size or hi % size:
        raise ValueError(
            f"{layer.layer_name}: the experts' down matrices are {NAMES[qtype]} blocks of {size} values, and this "
            f"rank's columns {lo}:{hi} of {cols} cut through a block; use a -tp whose share of the "
            f"{layer.intermediate_full} intermediate values is a multiple of {size}, or --enable-expert-parallel"
        )
    return data[:, lo // size * nbytes : hi // size * nbytes]
