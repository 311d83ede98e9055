"""Gemma 2 and Gemma 3 (text): the Llama-family decoder with Gemma's differences.

What both share (and how it follows the Hugging Face reference, ``transformers`` 5.x):

- **RMSNorm with (1 + w)**: :class:`GemmaRMSNorm` normalizes in float32 and multiplies by
  ``1 + w`` in float32 before casting back. The parameter holds ``1 + w`` (float32, whatever the
  model dtype; :meth:`GemmaForCausalLM.load_weights` adds the 1 as checkpoints load), so in a
  float32 model it is an ordinary :class:`~host.core.models.layers.RMSNorm` and the platform's
  norm kernels (fused residual add included) apply unchanged.
- **sandwich norms**: each block is ``x + post_attention_norm(attn(input_norm(x)))`` then
  ``x + post_feedforward_norm(mlp(pre_feedforward_norm(x)))``.
- **embedding scale**: the token embeddings times ``sqrt(hidden_size)``, the factor rounded to
  the model dtype first (as the reference does); the tied LM head uses the unscaled table.
- **GeGLU**: ``down(gelu_tanh(gate(x)) * up(x))`` (``hidden_activation``:
  ``gelu_pytorch_tanh``, or ``gelu`` for the exact form).
- **attention scale** ``query_pre_attn_scalar ** -0.5`` (not ``head_dim ** -0.5``).
- **local / global layers**: ``config.layer_types`` marks each layer ``sliding_attention``
  (window ``config.sliding_window``) or ``full_attention``.
- **final-logit soft-capping** ``cap * tanh(logits / cap)`` when ``final_logit_softcapping``
  is set (on the float32 logits).

Gemma 2 adds **attention-logit soft-capping** (``attn_logit_softcapping``, 50 in the released
models), computed by the attention backend (``logits_soft_cap``); its local and global layers
share one RoPE. Gemma 3 adds **q/k norms** (a Gemma RMSNorm over each head) and a **RoPE per
layer type**: ``config.rope_parameters`` is ``{"sliding_attention": {...}, "full_attention":
{...}}`` (the local base ``rope_local_base_freq``, 10 000 by default; the global one
``rope_theta``, 1 000 000, with the global scaling when configured). The reference Gemma 3
computes no attention soft-capping even when ``attn_logit_softcapping`` is set, and neither
does this one (a warning says so). Bidirectional Gemma 3 (``use_bidirectional_attention``,
EmbeddingGemma) is refused.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any, Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from host.core.models.layers import RMSNorm, RotaryEmbedding, rope_parameters_from_config
from host.core.models.llama import DecoderAttention, GatedMLP, LlamaForCausalLM, PipelineStageStack, _head_dim, _sliding_window
from host.core.models.parallel_layers import ModelShard
from host.core.models.pipeline import MissingLayer

logger = logging.getLogger("host.models")

SLIDING, FULL = "sliding_attention", "full_attention"


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm: ``(x / rms(x)) * (1 + w)`` computed in float32, cast back to x's dtype.

    ``weight`` holds ``1 + w`` in float32 (filled by :meth:`GemmaForCausalLM.load_weights`;
    ``1`` until then). Same call contract as :class:`RMSNorm` (``forward(x)``, ``forward(x,
    residual)``); a platform kernel is used only for float32 inputs (the weight is float32)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, dtype: torch.dtype | None = None) -> None:
        super().__init__(hidden_size, eps, dtype=torch.float32)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * self.weight).to(x.dtype)


_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
}


class GatedGelu(nn.Module):
    """``act(gate) * up`` of the fused ``[gate | up]`` output, ``act`` a GELU of :data:`_ACTIVATIONS`."""

    def __init__(self, act: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = act

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.fn(gate) * up


class GemmaMLP(GatedMLP):
    """GeGLU feed-forward: ``down(act(gate(x)) * up(x))``, gate and up fused: :class:`GatedMLP`
    (its attribute names, so checkpoint loading maps the same way) with Gemma's activation."""

    @staticmethod
    def activation(config: Any) -> nn.Module:
        act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None) or "gelu_pytorch_tanh"
        if act not in _ACTIVATIONS:
            raise ValueError(
                f"hidden_activation={act!r} is not supported for Gemma; supported: {', '.join(_ACTIVATIONS)}"
            )
        return GatedGelu(_ACTIVATIONS[act])


class GemmaDecoderLayer(nn.Module):
    """One Gemma block: the sandwich norms around attention and the MLP.

    Takes and returns ``(hidden, residual)`` like the Llama layer (the residual stream beside
    the block output, ``residual=None`` for the first layer), so the norm before each sub-block
    adds the two in one call; the additions are the reference's, in the same order."""

    def __init__(
        self, config: Any, layer_idx: int, dtype: torch.dtype, attn_backend: type | None, quant: Any,
        shard: ModelShard, qkv_bias: bool, o_bias: bool, qk_norm: bool, logits_soft_cap: float | None,
        window_of: Callable[[Any, int], int | None],
    ) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.layer_type = config.layer_types[layer_idx]
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.self_attn = DecoderAttention(
            config, layer_idx, dtype, attn_backend, qkv_bias, o_bias, qk_norm, quant=quant, shard=shard,
            scale=float(config.query_pre_attn_scalar) ** -0.5, logits_soft_cap=logits_soft_cap, norm_cls=GemmaRMSNorm,
            window_of=window_of,
        )
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.mlp = GemmaMLP(config, dtype, layer_idx, quant, shard)
        self.post_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, eps)

    def forward(
        self, hidden: torch.Tensor, residual: torch.Tensor | None, ropes: dict[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.post_attention_layernorm(self.self_attn(hidden, ropes[self.layer_type]))
        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
        return self.post_feedforward_layernorm(self.mlp(hidden)), residual


def layer_types(config: Any) -> list[str]:
    """Each layer's type, ``sliding_attention`` or ``full_attention``, from ``config.layer_types``
    (a ``ValueError`` for a list of the wrong length or an unknown type)."""
    types = list(getattr(config, "layer_types", None) or [FULL] * config.num_hidden_layers)
    if len(types) != config.num_hidden_layers or set(types) - {SLIDING, FULL}:
        raise ValueError(
            f"config.layer_types={types!r} must list {SLIDING!r} or {FULL!r} for each of the "
            f"{config.num_hidden_layers} layers"
        )
    if SLIDING in types and not getattr(config, "sliding_window", None):
        raise ValueError("config.layer_types has sliding_attention layers but config.sliding_window is not set")
    return types


def rope_parameters_for(config: Any, layer_type: str) -> dict[str, Any]:
    """The flat RoPE settings of ``layer_type``'s layers: ``config.rope_parameters[layer_type]``
    when the config keeps one set per layer type (Gemma 3), else the config's single set."""
    params = getattr(config, "rope_parameters", None) or {}
    if isinstance(params.get(layer_type), dict):
        view = SimpleNamespace(
            rope_parameters=dict(params[layer_type]),
            max_position_embeddings=config.max_position_embeddings,
            original_max_position_embeddings=getattr(config, "original_max_position_embeddings", None),
            partial_rotary_factor=None,
        )
        return rope_parameters_from_config(view)
    return rope_parameters_from_config(config)


class GemmaModel(PipelineStageStack):
    """Embedding (scaled by ``sqrt(hidden_size)``), the Gemma blocks and the final norm (the
    ``model.`` prefix), with :class:`~host.core.models.llama.DecoderModel`'s attributes for the
    runner: the pipeline stages of :class:`~host.core.models.llama.PipelineStageStack`, and ``decode_kernel`` (always ``None``: the CPU fused decode step is
    Llama's block only). ``rotary_emb`` maps each layer type to its :class:`RotaryEmbedding`."""

    def __init__(
        self, config: Any, dtype: torch.dtype, attn_backend: type | None, quant: Any = None,
        shard: ModelShard | None = None, *, qkv_bias: bool = False, o_bias: bool = False, qk_norm: bool = False,
        logits_soft_cap: float | None = None, window_of: Callable[[Any, int], int | None] | None = None,
        context_len: int | None = None,
    ) -> None:
        """``window_of(config, layer_idx)``: each layer's sliding window (the model class's
        ``layer_sliding_window``); ``context_len`` is taken for the decoder contract and unused
        (Gemma's RoPE types do not depend on it)."""
        super().__init__()
        shard = shard or ModelShard()
        types = layer_types(config)
        window_of = window_of or _sliding_window
        self.init_stage(config, dtype, quant, shard)
        # sqrt(hidden) rounded to the model dtype, as the reference's scaled embedding does
        self.register_buffer("normalizer", torch.tensor(config.hidden_size**0.5, dtype=torch.float32).to(dtype), persistent=False)
        self.layers = nn.ModuleList(
            GemmaDecoderLayer(config, i, dtype, attn_backend, quant, shard, qkv_bias, o_bias, qk_norm, logits_soft_cap, window_of)
            if self.start_layer <= i < self.end_layer
            else MissingLayer()
            for i in range(config.num_hidden_layers)
        )
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps) if self.is_last_stage else None
        self.rotary_emb = nn.ModuleDict({
            kind: RotaryEmbedding(_head_dim(config), rope_parameters_for(config, kind), config.max_position_embeddings, dtype)
            for kind in sorted(set(types))
        })
        self.decode_kernel: Callable[..., torch.Tensor | None] | None = None

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, intermediate: dict[str, torch.Tensor] | None = None
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        if self.is_first_stage:
            hidden, residual = self.embed_tokens(input_ids) * self.normalizer, None
        else:
            hidden, residual = self.stage_input(intermediate)
        return self.run_layers(hidden, residual, {kind: emb.prepare(positions) for kind, emb in self.rotary_emb.items()})


class Gemma2ForCausalLM(LlamaForCausalLM):
    """Gemma 2 (``model_type`` ``gemma2``): see the module docstring for what differs from Llama.

    Built like :class:`LlamaForCausalLM` (``quant_plan``, ``shard``); its checkpoints load with
    the Hugging Face names (norm weights ``w`` are stored as ``1 + w``)."""

    decoder_cls = GemmaModel
    qk_norm = False

    @staticmethod
    def attention_soft_cap(config: Any) -> float | None:
        """The attention-logit soft cap this architecture applies (``None``: none)."""
        cap = getattr(config, "attn_logit_softcapping", None)
        return float(cap) if cap else None

    def __init__(self, hf_config: Any, dtype: torch.dtype = torch.float32, attn_backend: type | None = None,
                 quant_plan: Any = None, shard: ModelShard | None = None) -> None:
        if getattr(hf_config, "use_bidirectional_attention", False):
            raise ValueError(
                f"{type(self).__name__}: use_bidirectional_attention=True (an embedding model such as "
                "EmbeddingGemma) is not supported; only causal Gemma language models are"
            )
        super().__init__(hf_config, dtype, attn_backend, quant_plan, shard)
        cap = getattr(hf_config, "final_logit_softcapping", None)
        self.final_logit_softcapping = float(cap) if cap else None

    def decoder_kwargs(self, config: Any) -> dict[str, Any]:
        return {"logits_soft_cap": self.attention_soft_cap(config)}

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """float32 logits, soft-capped to ``(-cap, cap)`` when ``final_logit_softcapping`` is set."""
        logits = super().compute_logits(hidden_states)
        cap = self.final_logit_softcapping
        if cap is None:
            return logits
        return torch.tanh(logits / cap) * cap

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """:meth:`LlamaForCausalLM.load_weights`, with every norm weight ``w`` (Hugging Face
        naming: ``*norm.weight``) stored as ``1 + w`` in float32 (see :class:`GemmaRMSNorm`)."""
        return super().load_weights(_plus_one_norms(weights, self.dtype))


def _plus_one_norms(weights: Iterable[tuple[str, Any]], dtype: torch.dtype) -> Iterator[tuple[str, Any]]:
    for name, tensor in weights:
        if name.endswith("norm.weight"):
            if hasattr(tensor, "dequantize") and not isinstance(tensor, torch.Tensor):
                tensor = tensor.dequantize(torch.float32)
            tensor = 1.0 + tensor.float()
        yield name, tensor


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    """Gemma 3 text (``model_type`` ``gemma3_text``): Gemma 2 plus q/k norms and a RoPE per
    layer type, without attention soft-capping (as the reference)."""

    qk_norm = True

    @staticmethod
    def attention_soft_cap(config: Any) -> float | None:
        if getattr(config, "attn_logit_softcapping", None):
            logger.warning(
                "Gemma 3 config sets attn_logit_softcapping=%s; the reference Gemma 3 does not apply it, "
                "and neither does host", config.attn_logit_softcapping,
            )
        return None
