"""Mistral and Ministral: Llama-shaped decoders with sliding-window attention.

Both are :class:`~host.core.models.llama.LlamaForCausalLM` (the same q/k/v, gate/up, norms,
RoPE and checkpoint names); they differ only in which layers attend over a sliding window,
following transformers exactly:

- ``MistralForCausalLM`` (Mistral 7B v0.1, Mistral-Nemo, Codestral, ...): every layer uses
  ``config.sliding_window`` when it is set, none when it is null (v0.2 and later). transformers'
  Mistral ignores ``layer_types``, so this does too.
- ``MinistralForCausalLM`` (Ministral 8B): the window applies to the layers
  ``config.layer_types`` marks ``sliding_attention`` (interleaved sliding and full layers).

The window is per layer (``Attention.sliding_window``): the paged backends and the dense
fallback mask keys more than ``sliding_window - 1`` positions before the query, and the model
runner gives sliding layers a ``SlidingWindowSpec`` and the others a ``FullAttentionSpec``.
"""

from __future__ import annotations

from host.core.models.llama import LlamaForCausalLM, every_layer_window


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral: Llama with ``config.sliding_window`` on every layer (when set)."""

    layer_sliding_window = staticmethod(every_layer_window)


class MinistralForCausalLM(LlamaForCausalLM):
    """Ministral: Llama with ``config.sliding_window`` on the layers ``config.layer_types`` marks
    ``sliding_attention`` (transformers' MinistralConfig fills ``layer_types`` with all sliding
    when the config names a window and no layer types)."""
