"""Phi-3 family: Phi-3-mini and -medium, Phi-3.5-mini, Phi-4, Phi-4-mini (not Phi-3-small, a
different architecture).

A Llama-shaped decoder (pre-norm RMSNorm, SiLU-GLU, RoPE, no biases), so the model is
:class:`~host.core.models.llama.LlamaForCausalLM` with three differences, each taken from
transformers' ``modeling_phi3``:

- the checkpoint stores q/k/v as one ``self_attn.qkv_proj`` (rows q, then k, then v) and
  gate/up as one ``mlp.gate_up_proj`` (gate rows first). :meth:`Phi3ForCausalLM.load_weights`
  splits them into the q/k/v and gate/up parts and loads each through Llama's path, so
  tensor-parallel sharding (q heads split, kv heads split or replicated), quantized layers and
  GGUF blocks (split by whole rows) work as for Llama;
- ``config.sliding_window``, when set (Phi-3-mini-4k: 2047), applies to every layer;
- RoPE may be ``longrope`` (``rope_scaling`` with ``short_factor`` / ``long_factor``,
  ``original_max_position_embeddings``, cos/sin scaled by ``sqrt(1 + log(factor) /
  log(original))``) and partial (``partial_rotary_factor``: Phi-4-mini rotates 96 of 128 dims):
  both live in :class:`~host.core.models.layers.RotaryEmbedding`, which documents how the
  long/short factor set is chosen (once per engine, from its max_model_len).

Tied embeddings (Phi-4-mini) work as for Llama.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import torch

from host.core.models.llama import LlamaForCausalLM, _head_dim, every_layer_window


def _rows(tensor: Any, start: int, stop: int) -> Any:
    """Rows ``[start, stop)`` of a float tensor or of a GGUF block tensor."""
    if isinstance(tensor, torch.Tensor):
        return tensor[start:stop]
    return tensor.index_rows(slice(start, stop))


def _num_rows(tensor: Any) -> int:
    return int(tensor.shape[0])


class Phi3ForCausalLM(LlamaForCausalLM):
    """Phi-3 / Phi-4: Llama with fused checkpoint projections, a sliding window on every layer
    when the config sets one, and LongRoPE / partial rotary from the config."""

    layer_sliding_window = staticmethod(every_layer_window)

    @staticmethod
    def qkv_bias(config: Any) -> bool:
        return False

    @staticmethod
    def o_bias(config: Any) -> bool:
        return False

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load a Phi-3 checkpoint: ``qkv_proj`` and ``gate_up_proj`` tensors are split into the
        q/k/v and gate/up tensors Llama's loader takes (a fused tensor of the wrong row count
        is a ``ValueError``); everything else is as :meth:`LlamaForCausalLM.load_weights`."""
        return super().load_weights(self._split_fused(weights))

    def _split_fused(self, weights: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        config = self.config
        head_dim = _head_dim(config)
        q = config.num_attention_heads * head_dim
        kv = (getattr(config, "num_key_value_heads", None) or config.num_attention_heads) * head_dim
        inter = config.intermediate_size
        for name, tensor in weights:
            prefix, fused, suffix = _fused_part(name)
            if fused == "self_attn.qkv_proj":
                parts = (("q_proj", 0, q), ("k_proj", q, q + kv), ("v_proj", q + kv, q + 2 * kv))
                total = q + 2 * kv
            elif fused == "mlp.gate_up_proj":
                parts = (("gate_proj", 0, inter), ("up_proj", inter, 2 * inter))
                total = 2 * inter
            else:
                yield name, tensor
                continue
            if _num_rows(tensor) != total:
                raise ValueError(
                    f"checkpoint tensor {name!r} has {_num_rows(tensor)} rows, expected {total} from config.json "
                    "(heads x head_dim for q, k and v, or 2 x intermediate_size); the weights do not match the config"
                )
            module = fused.split(".")[0]
            for part, start, stop in parts:
                yield f"{prefix}{module}.{part}.{suffix}", _rows(tensor, start, stop)


def _fused_part(name: str) -> tuple[str, str | None, str]:
    """``(layer prefix, fused module, suffix)`` of a checkpoint name such as
    ``model.layers.3.self_attn.qkv_proj.weight``; the module is ``None`` for other names."""
    for fused in ("self_attn.qkv_proj", "mlp.gate_up_proj"):
        marker = f".{fused}."
        if marker in name:
            prefix, _, suffix = name.partition(marker)
            return prefix + ".", fused, suffix
    return name, None, ""
