"""Llama-family decoder-only models: Llama (1/2/3, SmolLM, Mistral-shaped), Qwen2, Qwen3.

Tokens arrive flattened — ``input_ids`` and ``positions`` are [num_tokens] with no batch
dimension — so one forward serves any mix of prefills and decodes; the attention backend
(through the forward context) knows which tokens belong to which sequence. Outside the model
runner, attention falls back to dense causal attention over the tokens as one sequence.

q/k/v are one fused projection and gate/up another (one matmul each instead of three and
two); :meth:`LlamaForCausalLM.load_weights` splits Hugging Face checkpoints into them.

With a quantization plan (``quant_plan``, see :mod:`host.core.models.quant_plan`) the linear layers
and the token embedding it names are built as :class:`QuantLinear` / :class:`QuantEmbedding`; their
checkpoint tensors go to the layer's method instead of a parameter copy.

Distributed (``shard``, a :class:`ModelShard`; default: this process's groups): with ``-tp N`` the
projections are the tensor-parallel layers of :mod:`host.core.models.parallel_layers` (q heads
split, kv heads split or replicated, one all-reduce after ``o_proj`` and one after ``down_proj``,
vocabulary-split embedding and LM head); at ``-tp 1`` they are the plain modules. With ``-pp N`` a
stage builds only its layers (:mod:`host.core.models.pipeline`), the embedding only on the first
stage and the final norm and LM head only on the last; ``forward`` then takes and returns the
``{"hidden", "residual"}`` pair passed between stages.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable

import torch
from torch import nn

from host.core.models.attention_layer import Attention
from host.core.models.layers import (
    RMSNorm,
    RopeBatch,
    RotaryEmbedding,
    SiluAndMul,
    rope_parameters_from_config,
)
from host.core.models.parallel_layers import (
    PARALLEL_LAYERS,
    ModelShard,
    ParallelLMHead,
    VocabParallelEmbedding,
    check_tp_shardable,
    column_linear,
    kv_heads_per_rank,
    lm_head,
    qkv_shard_rows,
    row_linear,
    vocab_embedding,
)
from host.core.models.pipeline import MissingLayer, stage_layers
from host.core.models.quant_linear import QuantEmbedding, QuantLinear, finish_loading
from host.core.models.weight_fill import check_complete, copy_into
from host.interfaces.model import ModelForCausalLM

_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# Hugging Face sub-projection -> (our fused parameter, shard id)
_STACKED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", "q"),
    "self_attn.k_proj": ("self_attn.qkv_proj", "k"),
    "self_attn.v_proj": ("self_attn.qkv_proj", "v"),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}


def _head_dim(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _sliding_window(config: Any, layer_idx: int) -> int | None:
    """The window of layer ``layer_idx`` when the config marks it as sliding, else ``None``."""
    layer_types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if not layer_types or not window:
        return None
    return window if layer_types[layer_idx] == "sliding_attention" else None


def every_layer_window(config: Any, layer_idx: int) -> int | None:
    """``config.sliding_window`` for every layer when set (Mistral, Phi-3), else ``None``."""
    window = getattr(config, "sliding_window", None)
    return int(window) if window else None


class DecoderAttention(nn.Module):
    """Self-attention of one decoder layer: fused qkv projection, optional per-head q/k RMSNorm
    (Qwen3), RoPE, the paged :class:`Attention`, output projection.

    ``window_of(config, layer_idx)`` gives the layer's sliding window (``None``: full attention);
    the default reads ``config.layer_types``."""

    def __init__(
        self,
        config: Any,
        layer_idx: int,
        dtype: torch.dtype,
        attn_backend: type | None,
        qkv_bias: bool,
        o_bias: bool,
        qk_norm: bool,
        quant: Any = None,
        shard: ModelShard | None = None,
        window_of: Callable[[Any, int], int | None] = _sliding_window,
        scale: float | None = None,
        logits_soft_cap: float | None = None,
        norm_cls: type[nn.Module] = RMSNorm,
        sinks: bool = False,
    ) -> None:
        """``scale`` (default ``head_dim ** -0.5``), ``logits_soft_cap`` (default off) and
        ``norm_cls`` (the q/k norm's class) are for architectures that differ there (Gemma);
        ``sinks`` gives the attention learned per-head sink logits (gpt-oss, ``attn.sinks``)."""
        super().__init__()
        shard = shard or ModelShard()
        tp = shard.tp_size
        total_heads = config.num_attention_heads
        total_kv_heads = getattr(config, "num_key_value_heads", None) or total_heads
        # this rank's heads: q heads split, kv heads split or (fewer kv heads than ranks) replicated
        self.num_heads = total_heads // tp
        self.num_kv_heads = kv_heads_per_rank(total_kv_heads, tp)
        self.head_dim = _head_dim(config)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        prefix = f"model.layers.{layer_idx}.self_attn"
        linear_for = None if quant is None else quant.linear_method
        full_q, full_kv = total_heads * self.head_dim, total_kv_heads * self.head_dim
        rows = qkv_shard_rows(total_heads, total_kv_heads, self.head_dim, shard.tp_rank, tp) if tp > 1 else None
        self.qkv_proj = column_linear(
            linear_for, f"{prefix}.qkv_proj", config.hidden_size, [full_q, full_kv, full_kv], qkv_bias, dtype,
            shard_rows=rows, **shard.tp_kwargs(),
        )
        self.o_proj = row_linear(linear_for, f"{prefix}.o_proj", full_q, config.hidden_size, o_bias, dtype, **shard.tp_kwargs())
        if qk_norm:
            self.q_norm = norm_cls(self.head_dim, config.rms_norm_eps, dtype=dtype)
            self.k_norm = norm_cls(self.head_dim, config.rms_norm_eps, dtype=dtype)
        else:
            self.q_norm = self.k_norm = None
        self.attn = Attention(
            self.num_heads,
            self.head_dim,
            self.num_kv_heads,
            scale=self.head_dim**-0.5 if scale is None else scale,
            layer_idx=layer_idx,
            backend=attn_backend,
            sliding_window=window_of(config, layer_idx),
            logits_soft_cap=logits_soft_cap,
            sinks=sinks,
        )

    def shard_slice(self, shard: str) -> slice:
        """Rows of ``qkv_proj`` that hold the q, k or v projection."""
        start = {"q": 0, "k": self.q_size, "v": self.q_size + self.kv_size}[shard]
        return slice(start, start + (self.q_size if shard == "q" else self.kv_size))

    def forward(self, hidden: torch.Tensor, rope: RopeBatch) -> torch.Tensor:
        n = hidden.shape[0]
        qkv = self.qkv_proj(hidden)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.q_norm is not None:
            q = rope.apply(self.q_norm(q.reshape(n * self.num_heads, self.head_dim)).view(n, self.num_heads, self.head_dim))
            k = rope.apply(self.k_norm(k.reshape(n * self.num_kv_heads, self.head_dim)).view(n, self.num_kv_heads, self.head_dim))
        else:
            # q and k are adjacent in the fused projection: rotate both heads' sets at once
            # (in place when the platform has a rotary kernel)
            qk = qkv[:, : self.q_size + self.kv_size].view(n, self.num_heads + self.num_kv_heads, self.head_dim)
            q, k = rope.apply(qk).split([self.num_heads, self.num_kv_heads], dim=1)
        out = self.attn(q.reshape(n, self.q_size), k.reshape(n, self.kv_size), v.contiguous())
        return self.o_proj(out)


class GatedMLP(nn.Module):
    """SiLU-GLU feed-forward: ``down(silu(gate(x)) * up(x))`` with gate/up fused. A subclass
    with another gate function overrides :meth:`activation`."""

    def __init__(
        self, config: Any, dtype: torch.dtype, layer_idx: int = 0, quant: Any = None, shard: ModelShard | None = None,
        intermediate_size: int | None = None, prefix: str | None = None,
    ) -> None:
        """``intermediate_size`` (default ``config.intermediate_size``) and ``prefix`` (default
        ``model.layers.<i>.mlp``) serve an MLP inside another block (an MoE's shared expert)."""
        super().__init__()
        self.act = self.activation(config)
        shard = shard or ModelShard()
        bias = bool(getattr(config, "mlp_bias", False))
        hidden, inter = config.hidden_size, intermediate_size or config.intermediate_size
        self.intermediate_size = inter // shard.tp_size  # this rank's
        prefix = prefix or f"model.layers.{layer_idx}.mlp"
        linear_for = None if quant is None else quant.linear_method
        self.gate_up_proj = column_linear(
            linear_for, f"{prefix}.gate_up_proj", hidden, [inter, inter], bias, dtype, **shard.tp_kwargs()
        )
        self.down_proj = row_linear(linear_for, f"{prefix}.down_proj", inter, hidden, bias, dtype, **shard.tp_kwargs())

    @staticmethod
    def activation(config: Any) -> nn.Module:
        """The module taking the fused ``[gate | up]`` output to ``act(gate) * up``."""
        act = getattr(config, "hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ValueError(f"hidden_act={act!r} is not supported by this model; only 'silu' is")
        return SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x)).

    ``mlp_of(config, dtype, layer_idx, quant, shard)`` builds the feed-forward block (default
    :class:`GatedMLP`; a mixture-of-experts model passes its sparse block); ``attn_cls`` the
    attention (default :class:`DecoderAttention`).

    The residual stream travels next to the block output: the layer takes ``(hidden,
    residual)`` — the previous block's output and the sum before it, ``residual=None`` for the
    first layer — and each norm adds the two before normalizing (one fused pass on platforms
    with a kernel). The arithmetic is the reference's: the same additions in the same order.
    """

    def __init__(
        self,
        config: Any,
        layer_idx: int,
        dtype: torch.dtype,
        attn_backend: type | None,
        quant: Any = None,
        shard: ModelShard | None = None,
        mlp_of: Callable[..., nn.Module] | None = None,
        attn_cls: type[nn.Module] | None = None,
        **attn_kw: Any,
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype)
        self.self_attn = (attn_cls or DecoderAttention)(config, layer_idx, dtype, attn_backend, quant=quant, shard=shard, **attn_kw)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype)
        self.mlp = (mlp_of or GatedMLP)(config, dtype, layer_idx, quant, shard)

    def forward(
        self, hidden: torch.Tensor, residual: torch.Tensor | None, rope: RopeBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(hidden, rope)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class PipelineStageStack(nn.Module):
    """What every decoder stack (the ``model.`` module) shares for the runner's pipeline stages:
    :meth:`init_stage` sets ``start_layer`` / ``end_layer`` (the layers this stage holds),
    ``is_first_stage`` / ``is_last_stage`` and the embedding (first stage only, else ``None``);
    :meth:`stage_input` reads the stage before's hand-off; :meth:`run_layers` runs this stage's
    layers and ends with the final norm (last stage) or the hand-off to the next. The subclass
    builds ``layers`` (a :class:`MissingLayer` outside the stage) and ``norm`` (``None`` off
    the last stage)."""

    def init_stage(self, config: Any, dtype: torch.dtype, quant: Any, shard: ModelShard) -> None:
        self.start_layer, self.end_layer = stage_layers(
            config.num_hidden_layers, shard.pp_rank, shard.pp_size, shard.pp_layer_partition
        )
        self.is_first_stage, self.is_last_stage = shard.is_first_stage, shard.is_last_stage
        self.embed_tokens = (
            vocab_embedding(
                None if quant is None else quant.embedding_method, "model.embed_tokens", config.vocab_size,
                config.hidden_size, dtype, **shard.tp_kwargs(),
            )
            if self.is_first_stage
            else None
        )

    @staticmethod
    def stage_input(intermediate: dict[str, torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(hidden, residual)`` from the stage before (a stage after the first)."""
        if intermediate is None:
            raise ValueError("a pipeline stage after the first needs intermediate={'hidden': ..., 'residual': ...} from the stage before")
        return intermediate["hidden"], intermediate["residual"]

    def run_layers(
        self, hidden: torch.Tensor, residual: torch.Tensor | None, rope: Any
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """This stage's layers over ``(hidden, residual)``, each given ``rope``; then the final
        norm on the last stage, else the hand-off ``{"hidden", "residual"}``."""
        whole = self.end_layer - self.start_layer == len(self.layers)
        for layer in self.layers if whole else self.layers[self.start_layer : self.end_layer]:
            hidden, residual = layer(hidden, residual, rope)
        if not self.is_last_stage:
            return {"hidden": hidden, "residual": residual}
        if residual is None:  # no layers
            return self.norm(hidden)
        return self.norm(hidden, residual)[0]


class DecoderModel(PipelineStageStack):
    """Embedding, the decoder layers and the final norm (Hugging Face's ``model.`` prefix).

    On a pipeline stage only layers ``[start_layer, end_layer)`` are built (the others are
    :class:`MissingLayer`), the embedding only on the first stage (else ``embed_tokens`` is
    ``None``) and the final norm only on the last (else ``norm`` is ``None``). ``context_len``
    (the engine's max_model_len) goes to the rotary embedding, which LongRoPE reads."""

    def __init__(
        self,
        config: Any,
        dtype: torch.dtype,
        attn_backend: type | None,
        quant: Any = None,
        shard: ModelShard | None = None,
        context_len: int | None = None,
        **attn_kw: Any,
    ) -> None:
        super().__init__()
        shard = shard or ModelShard()
        self.init_stage(config, dtype, quant, shard)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, dtype, attn_backend, quant, shard, **attn_kw)
            if self.start_layer <= i < self.end_layer
            else MissingLayer()
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype) if self.is_last_stage else None
        self.rotary_emb = RotaryEmbedding(
            _head_dim(config), rope_parameters_from_config(config), config.max_position_embeddings, dtype,
            context_len=context_len,
        )
        # a platform may install decode_kernel(input_ids, positions, embeddings) running the
        # whole layer stack (final norm included) in one call; it returns None for a batch it
        # does not take, which then runs layer by layer. Its ``max_rows`` is the most one-token
        # rows it takes (speculative verification lays drafts out as rows up to that many)
        self.decode_kernel: Callable[..., torch.Tensor | None] | None = None

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, intermediate: dict[str, torch.Tensor] | None = None
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        if self.is_first_stage:
            hidden, residual = self.embed_tokens(input_ids), None
            if self.decode_kernel is not None:
                out = self.decode_kernel(input_ids, positions, hidden)
                if out is not None:
                    return out
        else:
            hidden, residual = self.stage_input(intermediate)
        return self.run_layers(hidden, residual, self.rotary_emb.prepare(positions))


class LlamaForCausalLM(ModelForCausalLM):
    """Llama architecture (also SmolLM2, TinyLlama, Mistral-shaped checkpoints).

    Built as ``LlamaForCausalLM(hf_config, dtype, attn_backend, quant_plan=None, shard=None,
    max_model_len=None)``; ``max_model_len`` is the longest sequence the engine runs (the loader
    passes it; the rotary embedding's LongRoPE factor choice reads it, default the config's
    ``max_position_embeddings``). Subclasses change the bias and q/k-norm switches and
    :meth:`layer_sliding_window`.

    For the model runner: ``start_layer`` / ``end_layer`` (the global layer indices this stage
    holds), ``is_first_stage`` / ``is_last_stage``, ``kv_heads_per_rank`` (the KV heads each
    attention layer caches on this rank); ``forward(input_ids, positions, intermediate=None)``
    (see :meth:`forward`); ``compute_logits`` only on the last stage, called by EVERY
    tensor-parallel rank there (the vocabulary-split logits are all-gathered).
    """

    supports_tensor_parallel = True
    supports_pipeline_parallel = True
    supports_quantization = True

    @staticmethod
    def qkv_bias(config: Any) -> bool:
        return bool(getattr(config, "attention_bias", False))

    @staticmethod
    def o_bias(config: Any) -> bool:
        return bool(getattr(config, "attention_bias", False))

    qk_norm = False
    # Hugging Face sub-projection -> (our fused parameter, shard id); a subclass adds its own
    stacked_params: dict[str, tuple[str, Any]] = _STACKED
    # the ``model.`` module: built as decoder_cls(config, dtype, attn_backend, quant_plan, shard,
    # qkv_bias=..., o_bias=..., qk_norm=...) with DecoderModel's attributes (Gemma has its own)
    decoder_cls: type[nn.Module] = DecoderModel

    def decoder_kwargs(self, config: Any) -> dict[str, Any]:
        """Keyword arguments a subclass's ``decoder_cls`` takes beyond DecoderModel's (none here)."""
        return {}

    @staticmethod
    def layer_sliding_window(config: Any, layer_idx: int) -> int | None:
        """The sliding window of layer ``layer_idx`` (``None``: full attention): the config's
        ``sliding_window`` on the layers ``config.layer_types`` marks ``sliding_attention``."""
        return _sliding_window(config, layer_idx)

    def __init__(
        self,
        hf_config: Any,
        dtype: torch.dtype = torch.float32,
        attn_backend: type | None = None,
        quant_plan: Any = None,
        shard: ModelShard | None = None,
        max_model_len: int | None = None,
    ) -> None:
        super().__init__()
        self.config = hf_config
        self.dtype = dtype
        self.shard = shard = shard or ModelShard.current()
        total_heads = hf_config.num_attention_heads
        total_kv_heads = getattr(hf_config, "num_key_value_heads", None) or total_heads
        if shard.tp_size > 1:
            check_tp_shardable(total_heads, total_kv_heads, hf_config.intermediate_size, shard.tp_size)
        self.kv_heads_per_rank = kv_heads_per_rank(total_kv_heads, shard.tp_size)
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
        self.model = self.decoder_cls(
            hf_config,
            dtype,
            attn_backend,
            quant_plan,
            shard,
            context_len=max_model_len,
            qkv_bias=self.qkv_bias(hf_config),
            o_bias=self.o_bias(hf_config),
            qk_norm=self.qk_norm,
            window_of=self.layer_sliding_window,
            **self.decoder_kwargs(hf_config),
        )
        self.start_layer, self.end_layer = self.model.start_layer, self.model.end_layer
        self.is_first_stage, self.is_last_stage = shard.is_first_stage, shard.is_last_stage
        # a platform may set this to a module computing ``hidden @ lm_head.weight^T`` faster
        # (for example with repacked weights); see Platform.prepare_model
        self.logits_head: nn.Module | None = None
        if not self.is_last_stage:
            self.lm_head = None
        elif self.tie_word_embeddings and self.is_first_stage:
            self.lm_head = self.model.embed_tokens
        elif self.tie_word_embeddings:  # the last stage holds its own copy of the tied embedding
            self.lm_head = vocab_embedding(
                None if quant_plan is None else quant_plan.embedding_method, "model.embed_tokens",
                hf_config.vocab_size, hf_config.hidden_size, dtype, **shard.tp_kwargs(),
            )
        else:
            self.lm_head = lm_head(
                None if quant_plan is None else quant_plan.linear_method,
                "lm_head", hf_config.hidden_size, hf_config.vocab_size, dtype, **shard.tp_kwargs(),
            )

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, intermediate: dict[str, torch.Tensor] | None = None
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """Hidden states after the final norm, [num_tokens, hidden_size], on the last pipeline
        stage; on the others ``{"hidden": ..., "residual": ...}`` (each [num_tokens,
        hidden_size]) for the next stage, which takes it as ``intermediate`` (required on every
        stage but the first; ``input_ids`` is then unused)."""
        return self.model(input_ids, positions, intermediate)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """float32 logits [num_tokens, vocab_size] for the given hidden states."""
        if self.logits_head is not None:
            return self.logits_head(hidden_states).float()
        if isinstance(self.lm_head, (VocabParallelEmbedding, ParallelLMHead)):
            return self.lm_head.logits(hidden_states).float()
        if isinstance(self.lm_head, QuantEmbedding):
            return self.lm_head.linear(hidden_states).float()
        if isinstance(self.lm_head, QuantLinear):
            return self.lm_head(hidden_states).float()
        return torch.nn.functional.linear(hidden_states, self.lm_head.weight).float()

    # -- weights -------------------------------------------------------------------------------

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy Hugging Face-named tensors into this model; returns the parameter names filled.

        q/k/v and gate/up tensors land in their slice of the fused projections; rotary
        ``inv_freq`` buffers are skipped, and so is ``lm_head.weight`` when embeddings are tied
        (the output projection then is the embedding, as in Hugging Face). An unknown tensor
        name, a shape mismatch or a parameter left unfilled is a ``ValueError``. A tensor for a
        quantized layer goes to its method (``QuantLinear.load_shard``); a GGUF tensor still in
        blocks is dequantized for a layer the plan leaves in float.

        Distributed: a tensor-parallel layer takes the FULL checkpoint tensor and keeps this
        rank's part (``load_checkpoint``); a pipeline stage skips the tensors of the layers, the
        embedding, the final norm and the LM head it does not hold (the last stage of a tied
        model fills its LM head from ``model.embed_tokens.weight``).
        """
        params = {name: p for name, p in self.named_parameters() if not self.loads_itself(name)}
        quantized = {
            f"{name}.weight": module
            for name, module in self.named_modules()
            if isinstance(module, (QuantLinear, QuantEmbedding))
        }
        parallel = {name: module for name, module in self.named_modules() if isinstance(module, PARALLEL_LAYERS)}
        filled: dict[str, set[Any]] = {}
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if not name.startswith(("model.", "lm_head.")):
                name = "model." + name  # a bare base-model checkpoint
            if name == "lm_head.weight" and self.tie_word_embeddings:
                continue
            if not self._held(name):
                continue  # another pipeline stage's tensor
            if self.load_extra_weight(name, tensor):
                continue
            if name.startswith("model.embed_tokens.") and not self.is_first_stage:
                name = "lm_head." + name.removeprefix("model.embed_tokens.")  # the tied head's copy
            target, shard, rows = self._target(name)
            module_name, _, suffix = target.rpartition(".")
            owner = parallel.get(module_name)
            if owner is not None:
                rel = owner.load_checkpoint(suffix, self._shard_index(owner, shard), tensor)
                if rel is not None:
                    filled.setdefault(f"{module_name}.{rel}", set()).add(shard)
                continue
            if target in quantized:
                layer = quantized[target]
                layer.load_shard(self._shard_index(layer, shard), tensor)
                continue
            if hasattr(tensor, "dequantize") and not isinstance(tensor, torch.Tensor):
                tensor = tensor.dequantize(self.dtype)  # a GGUF block tensor for a float layer
            param = params.get(target)
            if param is None:
                raise ValueError(
                    f"checkpoint tensor {name!r} has no matching parameter in "
                    f"{type(self).__name__}; is config.json's architecture right for these weights?"
                )
            copy_into(param, rows, tensor, label=f"checkpoint tensor {name!r}", target=target,
                      fix="the weights do not match config.json")
            filled.setdefault(target, set()).add(shard)
        check_complete(params, filled, source=f"the checkpoint of {type(self).__name__}",
                       fix="is the checkpoint complete and does it match config.json?")
        finish_loading(self)
        return set(filled) | set(quantized)

    def load_extra_weight(self, name: str, tensor: Any) -> bool:
        """A subclass's own checkpoint tensors (a mixture-of-experts model's experts): load
        ``tensor`` and return True, or return False to let the common rules place it."""
        return False

    def loads_itself(self, param_name: str) -> bool:
        """Whether parameter ``param_name`` is filled (and checked) by :meth:`load_extra_weight`'s
        owner rather than the common completeness check."""
        return False

    @staticmethod
    def _shard_index(layer: Any, shard: Any) -> int:
        """The index in ``layer.output_sizes`` of a checkpoint shard id (q/k/v, 0/1, or None)."""
        if shard is None:
            return 0
        return {"q": 0, "k": 1, "v": 2}.get(shard, shard) if isinstance(shard, str) else int(shard)

    def _held(self, name: str) -> bool:
        """Whether this pipeline stage holds the parameter of checkpoint tensor ``name`` (a layer
        index beyond the config's counts as held, so that it is reported as unknown)."""
        match = _LAYER_RE.match(name)
        if match is not None:
            idx = int(match.group(1))
            return idx >= len(self.model.layers) or self.start_layer <= idx < self.end_layer
        if name.startswith("model.embed_tokens."):
            return self.is_first_stage or (self.tie_word_embeddings and self.is_last_stage)
        if name.startswith(("model.norm.", "lm_head.")):
            return self.is_last_stage
        return True


    def _target(self, name: str) -> tuple[str, Any, slice | None]:
        """Our parameter for a Hugging Face tensor name: (name, shard id, rows it fills)."""
        match = _LAYER_RE.match(name)
        if match is None:
            return name, None, None
        idx, rest = int(match.group(1)), match.group(2)
        module, _, suffix = rest.rpartition(".")
        if module not in self.stacked_params or idx >= len(self.model.layers):
            return name, None, None
        fused, shard = self.stacked_params[module]
        layer = self.model.layers[idx]
        if isinstance(layer.get_submodule(fused), PARALLEL_LAYERS):
            return f"model.layers.{idx}.{fused}.{suffix}", shard, None  # the layer slices
        if fused.endswith("qkv_proj"):
            rows = layer.get_submodule(fused.rpartition(".")[0]).shard_slice(shard)
        else:  # a fused gate/up: the owning MLP's (this rank's) intermediate size per shard
            size = layer.get_submodule(fused.rpartition(".")[0]).intermediate_size
            rows = slice(shard * size, (shard + 1) * size)
        return f"model.layers.{idx}.{fused}.{suffix}", shard, rows


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2 / Qwen2.5: Llama with biases on the q/k/v projections (none on o_proj)."""

    @staticmethod
    def qkv_bias(config: Any) -> bool:
        return True

    @staticmethod
    def o_bias(config: Any) -> bool:
        return False


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3: Llama plus an RMSNorm over each head of q and k before RoPE."""

    qk_norm = True
