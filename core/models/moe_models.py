"""Mixture-of-experts architectures on the Llama family's attention (worker): Qwen2-MoE,
Qwen3-MoE, Mixtral and OLMoE. Each differs from its dense sibling only in the feed-forward block
(:class:`host.core.models.moe_block.SparseMoeBlock`) and, for OLMoE, its q/k norm."""

from __future__ import annotations

from typing import Any

import torch

from host.core.models.layers import RMSNorm, RopeBatch
from host.core.models.llama import DecoderAttention, every_layer_window
from host.core.models.moe_block import MoEForCausalLM


def _qwen_sparse(config: Any, layer_idx: int) -> bool:
    """Qwen2/3-MoE: sparse unless listed in ``mlp_only_layers``, every ``decoder_sparse_step``-th layer."""
    step = int(getattr(config, "decoder_sparse_step", 1) or 1)
    only_mlp = getattr(config, "mlp_only_layers", None) or []
    return layer_idx not in only_mlp and config.num_experts > 0 and (layer_idx + 1) % step == 0


class Qwen3MoeForCausalLM(MoEForCausalLM):
    """Qwen3-MoE (e.g. Qwen3-30B-A3B): Qwen3 attention (per-head q/k norm), softmax top-k
    routing renormalised when ``norm_topk_prob``, no shared expert."""

    qk_norm = True
    is_sparse = staticmethod(_qwen_sparse)

    def moe_kwargs(self, config: Any) -> dict[str, Any]:
        return {
            "num_experts": config.num_experts, "top_k": config.num_experts_per_tok,
            "moe_intermediate_size": config.moe_intermediate_size,
            "router": {"scoring": "softmax", "renormalize": bool(getattr(config, "norm_topk_prob", False))},
            "activation": _act(config),
        }


class Qwen2MoeForCausalLM(Qwen3MoeForCausalLM):
    """Qwen2-MoE / Qwen1.5-MoE: Qwen2 attention (q/k/v bias), plus a shared expert scaled by
    ``sigmoid(shared_expert_gate(x))``."""

    qk_norm = False

    @staticmethod
    def qkv_bias(config: Any) -> bool:
        return bool(getattr(config, "qkv_bias", True))

    @staticmethod
    def o_bias(config: Any) -> bool:
        return False

    def moe_kwargs(self, config: Any) -> dict[str, Any]:
        return {
            **super().moe_kwargs(config),
            "shared_intermediate_size": getattr(config, "shared_expert_intermediate_size", 0) or None,
            "shared_expert_gate": bool(getattr(config, "shared_expert_intermediate_size", 0)),
        }


class MixtralForCausalLM(MoEForCausalLM):
    """Mixtral: Mistral attention (a sliding window on every layer when set), softmax top-k
    renormalised, experts named ``block_sparse_moe.experts.<e>.w1/w3/w2``."""

    layer_sliding_window = staticmethod(every_layer_window)

    def moe_kwargs(self, config: Any) -> dict[str, Any]:
        return {
            "num_experts": config.num_local_experts, "top_k": config.num_experts_per_tok,
            "moe_intermediate_size": config.intermediate_size,
            "router": {"scoring": "softmax", "renormalize": True}, "activation": _act(config),
        }


class OlmoeAttention(DecoderAttention):
    """OLMoE's attention: RMSNorm over the WHOLE q and k projections (not per head) and an
    optional clamp of q, k and v to ``±clip_qkv``. Under tensor parallelism each rank holds its
    heads' part of the norm weight and the mean of squares is all-reduced."""

    def __init__(self, config: Any, layer_idx: int, dtype: torch.dtype, attn_backend: Any, *, shard: Any = None, **kw: Any) -> None:
        kw["qk_norm"] = False
        super().__init__(config, layer_idx, dtype, attn_backend, shard=shard, **kw)
        self.q_norm_full = RMSNorm(self.q_size, config.rms_norm_eps, dtype=dtype)
        self.k_norm_full = RMSNorm(self.kv_size, config.rms_norm_eps, dtype=dtype)
        self.clip = getattr(config, "clip_qkv", None)
        self.tp_size = 1 if shard is None else shard.tp_size
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        if self.tp_size > 1 and kv_heads % self.tp_size:
            raise ValueError(
                f"OLMoE normalises the whole k projection, so its {kv_heads} KV heads must split evenly over "
                f"-tp {self.tp_size}; use a -tp that divides {kv_heads}"
            )
        self.reduce = None
        if self.tp_size > 1 and shard.from_groups:
            from host.core.distributed.parallel_state import get_tp_group

            self.reduce = get_tp_group().all_reduce

    def _norm(self, x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
        if self.tp_size == 1:
            return norm(x)
        x32 = x.float()
        sq = x32.pow(2).sum(-1, keepdim=True)
        if self.reduce is not None:
            sq = self.reduce(sq)
        mean = sq / (x.shape[-1] * self.tp_size)
        return (norm.weight * (x32 * torch.rsqrt(mean + norm.eps)).to(x.dtype))

    def forward(self, hidden: torch.Tensor, rope: RopeBatch) -> torch.Tensor:
        n = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self._norm(q, self.q_norm_full), self._norm(k, self.k_norm_full)
        if self.clip is not None:
            q, k, v = (t.clamp(-self.clip, self.clip) for t in (q, k, v))
        q = rope.apply(q.reshape(n, self.num_heads, self.head_dim))
        k = rope.apply(k.reshape(n, self.num_kv_heads, self.head_dim))
        out = self.attn(q.reshape(n, self.q_size), k.reshape(n, self.kv_size), v.contiguous())
        return self.o_proj(out)


class OlmoeForCausalLM(MoEForCausalLM):
    """OLMoE: whole-projection q/k norms, softmax top-k (renormalised when ``norm_topk_prob``)."""

    def moe_kwargs(self, config: Any) -> dict[str, Any]:
        return {
            "num_experts": config.num_experts, "top_k": config.num_experts_per_tok,
            "moe_intermediate_size": config.intermediate_size,
            "router": {"scoring": "softmax", "renormalize": bool(getattr(config, "norm_topk_prob", False))},
            "activation": _act(config),
        }

    def decoder_kwargs(self, config: Any) -> dict[str, Any]:
        return {**super().decoder_kwargs(config), "attn_cls": OlmoeAttention}

    def load_extra_weight(self, name: str, tensor: Any) -> bool:
        """The whole-projection q/k norm weights, this rank's heads' part under tensor parallelism."""
        for theirs, ours in ((".self_attn.q_norm.", "q_norm_full"), (".self_attn.k_norm.", "k_norm_full")):
            if theirs in name and name.startswith("model.layers."):
                attn = self.model.layers[int(name.split(".")[2])].self_attn
                norm = getattr(attn, ours)
                size = norm.weight.shape[0]
                if tensor.shape[0] != size * self.shard.tp_size:
                    raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}; config.json expects "
                                     f"({size * self.shard.tp_size},)")
                norm.weight.data.copy_(tensor[self.shard.tp_rank * size : (self.shard.tp_rank + 1) * size])
                return True
        return super().load_extra_weight(name, tensor)

    def loads_itself(self, param_name: str) -> bool:
        return "_norm_full." in param_name or super().loads_itself(param_name)


def _act(config: Any) -> str:
    act = getattr(config, "hidden_act", "silu")
    if act in ("silu", "swish"):
        return "silu"
    if act == "gelu":
        return "gelu"
    raise ValueError(f"hidden_act={act!r}: the experts compute silu or gelu gates")
