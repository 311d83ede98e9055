"""gpt-oss (OpenAI's open-weight MoE, ``GptOssForCausalLM``) on the Llama family's decoder (worker).

What differs from the Llama family, and where it is done:

- **attention sinks**: every attention layer has a learned logit per query head
  (``self_attn.sinks`` in the checkpoint, our ``self_attn.attn.sinks``) whose ``exp`` joins the
  softmax denominator without a value; the attention backend computes it (``sinks`` in the
  attention contract, :mod:`host.interfaces.attention`; the class declares ``attention_sinks``
  so backend selection skips backends without them). Biases on q/k/v/o (``attention_bias``).
- **alternating sliding window**: ``config.layer_types`` marks layers ``sliding_attention``
  (``config.sliding_window`` tokens, 128 in the published models) or ``full_attention``; the
  Llama default :meth:`~host.core.models.llama.LlamaForCausalLM.layer_sliding_window` reads it,
  so the hybrid KV allocator gives each layer its sliding or full cache spec.
- **the MoE block**: a router with a bias (``mlp.router.weight/bias``, loaded as our
  ``mlp.gate``) choosing the top-k experts by logit with a softmax over those k — the numbers of
  :func:`host.core.moe.router.select_experts`' ``softmax`` scoring with ``renormalize=True`` —
  and experts with biases and gpt-oss's clamped SwiGLU (``swigluoai``: ``config.swiglu_limit``,
  ``config.swiglu_alpha`` default 1.702).
- **the checkpoint layout of the experts**: ``mlp.experts.gate_up_proj [E, H, 2I]`` with gate and
  up INTERLEAVED in the last dimension (gate ``[..., ::2]``, up ``[..., 1::2]``),
  ``gate_up_proj_bias [E, 2I]`` interleaved alike, ``down_proj [E, I, H]``, ``down_proj_bias
  [E, H]``: :meth:`GptOssForCausalLM.expert_tensor` de-interleaves and transposes each expert
  into :class:`~host.core.moe.layer.FusedMoE`'s layout (``w13 [2I, H]`` gate rows then up rows,
  ``w2 [H, I]``).
- **MXFP4 experts**: the published checkpoints (``quantization_config.quant_method == "mxfp4"``)
  store ``gate_up_proj`` and ``down_proj`` as ``..._blocks`` (uint8 ``[E, out, in / 32, 16]``: two
  fp4 e2m1 codes per byte, low nibble first, for the weight in ``[out, in]`` orientation, i.e.
  the transpose of the float checkpoint layout) and ``..._scales`` (uint8 E8M0 ``[E, out, in /
  32]``: one scale ``2 ** (s - 127)`` per 32 values). They are DEQUANTIZED to the model dtype at
  load (:func:`dequantize_mxfp4`); keeping them packed with an MXFP4 kernel is a later issue (39).
  The engine's quantization plan lets such a checkpoint through unquantized
  (:mod:`host.core.models.quant_plan`).
"""

from __future__ import annotations

import re
from typing import Any, Iterable

import torch

from host.core.models.moe_block import MoEForCausalLM

# e2m1 code -> value (sign bit 3, then exponent 2 bits, mantissa 1 bit)
FP4_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
MXFP4_BLOCK = 32  # values sharing one E8M0 scale

_MXFP4_RE = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)_(blocks|scales)$")
_SINKS_RE = re.compile(r"^model\.layers\.(\d+)\.self_attn\.sinks$")


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """MXFP4 ``blocks`` (uint8 ``[..., G, 16]``, two e2m1 codes per byte, low nibble first) and
    ``scales`` (uint8 E8M0 ``[..., G]``, ``2 ** (s - 127)``) -> ``dtype`` ``[..., G * 32]``: value
    ``2j`` of a group is the low nibble of byte ``j``, value ``2j + 1`` its high nibble."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales are uint8 tensors; got {blocks.dtype} and {scales.dtype}")
    if tuple(blocks.shape[:-1]) != tuple(scales.shape) or blocks.shape[-1] != MXFP4_BLOCK // 2:
        raise ValueError(
            f"MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do not fit: blocks must be "
            f"scales' shape plus a last dimension of {MXFP4_BLOCK // 2} bytes"
        )
    lut = torch.tensor(FP4_E2M1_VALUES, dtype=torch.float32, device=blocks.device)
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).long()  # [..., G, 16, 2]
    values = lut[codes].flatten(-2)  # [..., G, 32]
    exponents = scales.to(torch.int32) - 127
    return torch.ldexp(values, exponents.unsqueeze(-1).float()).flatten(-2).to(dtype)


def _deinterleave(tensor: torch.Tensor) -> torch.Tensor:
    """Rows ``g0 u0 g1 u1 ...`` (the first dimension) -> ``g0 g1 ... u0 u1 ...``."""
    return torch.cat([tensor[0::2], tensor[1::2]], dim=0)


class GptOssForCausalLM(MoEForCausalLM):
    """gpt-oss: Llama-family attention with biases and sinks, alternating sliding/full layers,
    a biased top-k router, and biased experts with the clamped SwiGLU (module doc)."""

    attention_sinks = True  # read by the attention backend selection (config_attention_sinks)

    def moe_kwargs(self, config: Any) -> dict[str, Any]:
        return {
            "num_experts": config.num_local_experts, "top_k": config.num_experts_per_tok,
            "moe_intermediate_size": config.intermediate_size,
            "router": {"scoring": "softmax", "renormalize": True},
            "activation": "swigluoai", "router_bias": True, "expert_bias": True,
            "alpha": float(getattr(config, "swiglu_alpha", None) or 1.702),
            "limit": float(config.swiglu_limit),
        }

    def decoder_kwargs(self, config: Any) -> dict[str, Any]:
        return {**super().decoder_kwargs(config), "sinks": True}

    def expert_tensor(self, proj: str, bias: bool, tensor: torch.Tensor) -> torch.Tensor:
        """One expert of the checkpoint's fused tensors in :meth:`FusedMoE.load_expert`'s layout:
        ``gate_up_proj [H, 2I]`` (interleaved columns) -> ``[2I, H]`` gate rows then up rows,
        its bias de-interleaved alike, ``down_proj [I, H]`` -> ``[H, I]``."""
        if proj == "gate_up_proj":
            return _deinterleave(tensor if bias else tensor.t())
        return tensor if bias else tensor.t()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """:meth:`MoEForCausalLM.load_weights` with gpt-oss's names: ``mlp.router.`` is our
        ``mlp.gate.``, ``self_attn.sinks`` this rank's heads of ``self_attn.attn.sinks``, and MXFP4
        expert blocks/scales are dequantized once both halves of a tensor arrived."""
        self._pending_mxfp4: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
        self._sinks_filled: set[int] = set()
        filled = super().load_weights((name.replace(".mlp.router.", ".mlp.gate."), t) for name, t in weights)
        if self._pending_mxfp4:
            halves = [f"layer {i} {proj}_{'/'.join(parts)}" for (i, proj), parts in sorted(self._pending_mxfp4.items())]
            raise ValueError(
                f"the checkpoint of GptOssForCausalLM has MXFP4 expert tensors without their other half "
                f"(blocks need scales): {', '.join(halves[:6])}; is the checkpoint complete?"
            )
        held = [i for i in range(self.start_layer, self.end_layer) if i not in self._sinks_filled]
        if held:
            raise ValueError(
                f"the checkpoint of GptOssForCausalLM has no self_attn.sinks for layer(s) {held[:6]}; "
                "is the checkpoint complete and does it match config.json?"
            )
        return filled

    def loads_itself(self, param_name: str) -> bool:
        return param_name.endswith(".attn.sinks") or super().loads_itself(param_name)

    def load_extra_weight(self, name: str, tensor: Any) -> bool:
        match = _SINKS_RE.match(name)
        if match is not None:
            idx = int(match.group(1))
            attn = self._layer(idx, name).self_attn.attn
            heads = attn.num_heads
            if tensor.shape[0] != heads * self.shard.tp_size:
                raise ValueError(
                    f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}; config.json's attention has "
                    f"{heads * self.shard.tp_size} heads"
                )
            rank = self.shard.tp_rank
            attn.sinks.data.copy_(tensor[rank * heads : (rank + 1) * heads].float())
            self._sinks_filled.add(idx)
            return True
        match = _MXFP4_RE.match(name)
        if match is not None:
            idx, proj, half = int(match.group(1)), match.group(2), match.group(3)
            parts = self._pending_mxfp4.setdefault((idx, proj), {})
            parts[half] = tensor
            if len(parts) == 2:
                del self._pending_mxfp4[(idx, proj)]
                weight = dequantize_mxfp4(parts["blocks"], parts["scales"], self.dtype)  # [E, out, in]
                # the float checkpoint's layout ([E, in, out]), loaded like a float tensor
                super().load_extra_weight(f"model.layers.{idx}.mlp.experts.{proj}", weight.transpose(1, 2))
            return True
        return super().load_extra_weight(name, tensor)

    def _layer(self, idx: int, name: str) -> Any:
        if idx >= len(self.model.layers):
            raise ValueError(f"checkpoint tensor {name!r} is for layer {idx}, beyond config.json's {len(self.model.layers)} layers")
        return self.model.layers[idx]
