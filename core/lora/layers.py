"""LoRA wrappers around the model's linears (worker), installed at load time only with
``--enable-lora``: without it the model has no wrapper at all and the base path is untouched.

:class:`LoRALinear` keeps the wrapped module (plain, repacked by the platform, or quantized)
and adds each token's adapter product after it, reading the step's
:class:`~host.core.lora.punica.LoRAMapping` from the forward context. A fused projection gets
one LoRA slice per sub-projection: ``qkv_proj`` the slices ``q_proj``, ``k_proj``, ``v_proj``
(their output rows side by side), ``gate_up_proj`` ``gate_proj`` and ``up_proj``; ``o_proj``
and ``down_proj`` one slice each.

Slot buffers, stored transposed so both products read contiguous rows: ``lora_a [max_loras,
in, n * r_max]`` holds the slices' A matrices (transposed) side by side along the rank axis;
``lora_b [max_loras, n * r_max, out]`` is block-diagonal (slice ``i``'s B, transposed, in its
rank rows and its output columns), pre-multiplied by the adapter's scale. A rank below
``max_lora_rank`` is zero-padded, and a module an adapter does not target stays zero (its
``active`` flag off, so its tokens are skipped), so one shrink and one expand serve every slice.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from host.contracts.forward_context import get_forward_context
from host.core.lora.adapter import module_shapes
from host.core.lora.punica import OP
from host.interfaces.kernels import kernel_for

# our fused module -> its Hugging Face sub-projections (PEFT's target names), in output order
FUSED_SLICES = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "o_proj": ("o_proj",),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "down_proj": ("down_proj",),
}
_PARENT = {"qkv_proj": "self_attn", "o_proj": "self_attn", "gate_up_proj": "mlp", "down_proj": "mlp"}


class LoRALinear(nn.Module):
    """``base(x)`` plus, per token, ``scale * (x @ A[slot].T) @ B[slot].T`` of its adapter.

    :param base: the module it wraps (called as it is).
    :param layer_idx: the decoder layer (adapters are keyed by ``(layer, module)``).
    :param slices: ``(module name, out features)`` of each sub-projection, in output order.
    """

    def __init__(
        self, base: nn.Module, layer_idx: int, slices: list[tuple[str, int]], in_features: int,
        max_loras: int, max_rank: int, dtype: torch.dtype, device: torch.device,
    ) -> None:
        super().__init__()
        self.base = base
        self.layer_idx = layer_idx
        self.slice_names = tuple(name for name, _ in slices)
        self.slice_sizes = tuple(size for _, size in slices)
        self.in_features = in_features
        self.out_features = sum(self.slice_sizes)
        self.max_rank = max_rank
        width = len(slices) * max_rank
        # plain attributes, not parameters or buffers: the checkpoint loader and state_dict
        # never see them
        # A is stored [in, slots, R] and seen as [slots, in, R]: every slot's A side by side is then
        # one contiguous [in, slots * R] matrix (the several-adapter shrink, punica.py)
        self._a_storage = torch.zeros(in_features, max_loras, width, dtype=dtype, device=device)
        self.lora_a = self._a_storage.transpose(0, 1)
        self.lora_b = torch.zeros(max_loras, width, self.out_features, dtype=dtype, device=device)
        self.active = [False] * max_loras
        self._impl = kernel_for(OP, torch.device(device).type)

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = self.base(x, *args, **kwargs)
        ctx = get_forward_context()
        mapping = getattr(ctx, "lora_mapping", None) if ctx is not None else None
        if mapping is None or mapping.num_tokens != x.shape[0]:
            return out  # no adapter in this step (or a pass that is not the step's, e.g. profiling)
        return self._impl(x, out, self.lora_a, self.lora_b, mapping, self.active)

    @torch.no_grad()
    def set_slot(self, slot: int, weights: dict[str, tuple[torch.Tensor, torch.Tensor]], scale: float) -> None:
        """Fill ``slot`` from ``{module name: (A [r, in], B [out, r])}`` (this layer's pairs of one
        adapter); slices it lacks become zero."""
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
        row = 0
        found = False
        for i, (name, size) in enumerate(zip(self.slice_names, self.slice_sizes)):
            pair = weights.get(name)
            if pair is not None:
                a, b = pair
                r = a.shape[0]
                ranks = slice(i * self.max_rank, i * self.max_rank + r)
                self.lora_a[slot, :, ranks] = a.t().to(self.lora_a.dtype)
                self.lora_b[slot, ranks, row : row + size] = (b.to(torch.float32) * scale).t().to(self.lora_b.dtype)
                found = True
            row += size
        self.active[slot] = found

    @torch.no_grad()
    def clear_slot(self, slot: int) -> None:
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
        self.active[slot] = False

    def extra_repr(self) -> str:
        return f"slices={self.slice_names}, in={self.in_features}, out={self.out_features}, max_rank={self.max_rank}"


def wrap_model(model: nn.Module, hf_config: Any, lora_config: Any, dtype: torch.dtype, device: torch.device) -> list[LoRALinear]:
    """Replace every q/k/v/o and gate/up/down linear of the layers this stage holds by a
    :class:`LoRALinear` around it; returns the wrappers. The fused whole-stack decode kernel a
    platform may have installed is kept for base-only steps (:class:`BaseStepsOnly`: it would
    bypass the wrappers). A model without
    the Llama family's layout is a ``ValueError``."""
    decoder = getattr(model, "model", None)
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"--enable-lora needs a Llama-family model (model.layers[i].self_attn / .mlp); "
                         f"{type(model).__name__} has no such layers")
    shapes = module_shapes(hf_config)
    start = getattr(model, "start_layer", 0)
    end = getattr(model, "end_layer", len(layers))
    wrappers: list[LoRALinear] = []
    for i in range(start, end):
        layer = layers[i]
        for fused, names in FUSED_SLICES.items():
            parent = getattr(layer, _PARENT[fused], None)
            base = getattr(parent, fused, None)
            if base is None:
                raise ValueError(f"--enable-lora: layer {i} of {type(model).__name__} has no {_PARENT[fused]}.{fused}; "
                                 "LoRA serves Llama-family models (Llama, Qwen2, Qwen3)")
            slices = [(n, shapes[n][1]) for n in names]
            wrapper = LoRALinear(base, i, slices, shapes[names[0]][0], lora_config.max_loras,
                                 lora_config.max_lora_rank, dtype, device)
            setattr(parent, fused, wrapper)
            wrappers.append(wrapper)
    kernel = getattr(decoder, "decode_kernel", None)
    if kernel is not None and not isinstance(kernel, BaseStepsOnly):
        decoder.decode_kernel = BaseStepsOnly(kernel)
    return wrappers


class BaseStepsOnly:
    """A platform's fused whole-stack decode kernel, kept for steps without adapters: it runs the
    base weights only, so a step with a LoRA mapping declines it (returns ``None``, the model then
    runs layer by layer through the wrappers)."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, embeddings: torch.Tensor) -> Any:
        ctx = get_forward_context()
        if ctx is not None and getattr(ctx, "lora_mapping", None) is not None:
            return None
        return self.kernel(input_ids, positions, embeddings)
