"""The sparse feed-forward block of mixture-of-experts decoders (worker), and what every MoE
architecture shares on top of the Llama family: :class:`SparseMoeBlock` (router, routed experts,
optional shared expert) and :class:`MoEForCausalLM` (its checkpoint names and the experts'
placement over the ranks).

The block: ``router_logits = gate(x)`` (a replicated linear, float), the routed experts
(:class:`host.core.moe.layer.FusedMoE`, sharded by tensor or expert parallelism, all-reduced over
the tensor-parallel group), plus a shared expert (a tensor-parallel :class:`GatedMLP`, Qwen2-MoE
and DeepSeek) optionally scaled by ``sigmoid(shared_expert_gate(x))``.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Iterable

import torch
from torch import nn

from host.core.models.llama import _STACKED, GatedMLP, LlamaForCausalLM
from host.core.models.parallel_layers import ModelShard
from host.core.moe.layer import FusedMoE

logger = logging.getLogger("host.models")

# Hugging Face expert tensor names: model.layers.<i>.<block>.experts.<e>.<proj>.weight
_EXPERT_RE = re.compile(r"^model\.layers\.(\d+)\.(mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.(weight|bias)$")
# the fused 3-D form (transformers v5 layout, every expert in one tensor)
_FUSED_EXPERTS_RE = re.compile(r"^model\.layers\.(\d+)\.(mlp|block_sparse_moe)\.experts\.(gate_up_proj|down_proj)(_bias)?$")
_PROJ_PART = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down", "w1": "gate", "w3": "up", "w2": "down"}


class SparseMoeBlock(nn.Module):
    """Router + routed experts (+ shared expert). ``forward(x [T, H]) -> [T, H]``."""

    def __init__(
        self,
        config: Any,
        layer_idx: int,
        dtype: torch.dtype,
        quant: Any,
        shard: ModelShard,
        *,
        num_experts: int,
        top_k: int,
        moe_intermediate_size: int,
        router: dict[str, Any],
        activation: str = "silu",
        router_bias: bool = False,
        expert_bias: bool = False,
        shared_intermediate_size: int | None = None,
        shared_expert_gate: bool = False,
        alpha: float = 1.702,
        limit: float = 7.0,
    ) -> None:
        super().__init__()
        prefix = f"model.layers.{layer_idx}.mlp"
        self.gate = nn.Linear(config.hidden_size, num_experts, bias=router_bias, dtype=dtype)
        # across data-parallel engines (-dp N --enable-expert-parallel) the tokens differ per rank:
        # forward gathers them all, each rank runs its experts, and the sum comes back per rank
        self.ep_group = shard.ep_group
        ep = shard.expert_parallel and (shard.tp_size > 1 or self.ep_group is not None)
        ep_rank, ep_size = (
            (self.ep_group.rank_in_group, self.ep_group.world_size) if self.ep_group is not None
            else (shard.tp_rank, shard.tp_size) if ep else (0, 1)
        )
        reduce = None
        if shard.tp_size > 1 and shard.from_groups and self.ep_group is None:
            from host.core.distributed.parallel_state import get_tp_group

            reduce = get_tp_group().all_reduce
        method = None if quant is None or not hasattr(quant, "moe_method") else quant.moe_method(f"{prefix}.experts")
        self.experts = FusedMoE(
            num_experts, top_k, config.hidden_size, moe_intermediate_size, dtype,
            router=router, activation=activation, bias=expert_bias, alpha=alpha, limit=limit,
            tp_rank=shard.tp_rank if self.ep_group is None else 0, tp_size=shard.tp_size if self.ep_group is None else 1,
            ep_rank=ep_rank, ep_size=ep_size,
            num_redundant=shard.num_redundant_experts, reduce=reduce, method=method, layer_name=prefix,
        )
        self.shared_expert = (
            GatedMLP(config, dtype, layer_idx, quant, shard, intermediate_size=shared_intermediate_size,
                     prefix=f"{prefix}.shared_expert")
            if shared_intermediate_size
            else None
        )
        self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False, dtype=dtype) if shared_expert_gate else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.experts(x, self.gate(x)) if self.ep_group is None else self._across_engines(x)
        if self.shared_expert is not None:
            shared = self.shared_expert(x)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return out


    def _across_engines(self, x: torch.Tensor) -> torch.Tensor:
        """Dispatch and combine over the expert-parallel group spanning the data-parallel engines:
        every rank's tokens gathered (padded to the longest rank's count), this rank's experts
        run over all of them, the partial sums all-reduced, and this rank's rows kept."""
        group = self.ep_group
        counts = group.all_gather(torch.tensor([x.shape[0]], dtype=torch.int64), dim=0).tolist()
        longest = max(counts)
        padded = torch.zeros(longest, x.shape[1], dtype=x.dtype, device=x.device)
        padded[: x.shape[0]] = x
        every = group.all_gather(padded, dim=0)
        out = group.all_reduce(self.experts(every, self.gate(every)))
        start = group.rank_in_group * longest
        return out[start : start + x.shape[0]]


class MoEForCausalLM(LlamaForCausalLM):
    """A Llama-family decoder whose feed-forward blocks are (some or all) :class:`SparseMoeBlock`.

    A subclass says which layers are sparse (:meth:`is_sparse`) and how the block is built
    (:meth:`moe_kwargs`); dense layers keep :class:`GatedMLP` with ``config.intermediate_size``.
    Checkpoint experts load per expert (``...experts.<e>.gate_proj.weight``, Mixtral's
    ``w1/w3/w2``) or fused (``...experts.gate_up_proj [E, 2I, H]``); ``block_sparse_moe.`` names
    load into ``mlp.``. Tensor parallel splits every expert; ``--enable-expert-parallel`` splits
    the experts over the tensor-parallel ranks instead."""

    stacked_params = {
        **_STACKED,
        "mlp.shared_expert.gate_proj": ("mlp.shared_expert.gate_up_proj", 0),
        "mlp.shared_expert.up_proj": ("mlp.shared_expert.gate_up_proj", 1),
    }

    @staticmethod
    def is_sparse(config: Any, layer_idx: int) -> bool:
        """Whether layer ``layer_idx`` routes through experts (default: every layer)."""
        return True

    def moe_kwargs(self, config: Any) -> dict[str, Any]:
        """:class:`SparseMoeBlock` keyword arguments for this architecture."""
        raise NotImplementedError

    def decoder_kwargs(self, config: Any) -> dict[str, Any]:
        moe = self.moe_kwargs(config)

        def mlp_of(cfg: Any, dtype: torch.dtype, layer_idx: int, quant: Any, shard: ModelShard) -> nn.Module:
            if self.is_sparse(cfg, layer_idx):
                return SparseMoeBlock(cfg, layer_idx, dtype, quant, shard, **moe)
            return GatedMLP(cfg, dtype, layer_idx, quant, shard)

        return {"mlp_of": mlp_of}

    def moe_layers(self) -> list[FusedMoE]:
        """This stage's routed-expert layers, in layer order."""
        return [m for m in self.modules() if isinstance(m, FusedMoE)]

    def loads_itself(self, param_name: str) -> bool:
        return ".experts." in param_name

    def load_extra_weight(self, name: str, tensor: Any) -> bool:
        name = name.replace(".block_sparse_moe.", ".mlp.")
        match = _EXPERT_RE.match(name)
        if match is not None:
            idx, expert, proj, kind = int(match.group(1)), int(match.group(3)), match.group(4), match.group(5)
            part = _PROJ_PART.get(proj)
            if part is None:
                raise ValueError(f"checkpoint tensor {name!r}: unknown expert projection {proj!r} (gate_proj/up_proj/down_proj, w1/w3/w2)")
            self._experts_of(idx, name).load_expert(expert, part + ("_bias" if kind == "bias" else ""), tensor)
            return True
        match = _FUSED_EXPERTS_RE.match(name)
        if match is not None:
            idx, proj, bias = int(match.group(1)), match.group(3), match.group(4)
            layer = self._experts_of(idx, name)
            for expert in range(tensor.shape[0]):
                part = ("gate_up" if proj == "gate_up_proj" else "down") + ("_bias" if bias else "")
                layer.load_expert(expert, part, self.expert_tensor(proj, bool(bias), tensor[expert]))
            return True
        return False

    def expert_tensor(self, proj: str, bias: bool, tensor: torch.Tensor) -> torch.Tensor:
        """One expert's slice of a fused 3-D checkpoint tensor, in :meth:`FusedMoE.load_expert`'s
        layout (the v5 layout already is; gpt-oss overrides)."""
        return tensor

    def _experts_of(self, idx: int, name: str) -> FusedMoE:
        if idx >= len(self.model.layers):
            raise ValueError(f"checkpoint tensor {name!r} is for layer {idx}, beyond config.json's {len(self.model.layers)} layers")
        mlp = self.model.layers[idx].mlp
        if not isinstance(mlp, SparseMoeBlock):
            raise ValueError(f"checkpoint tensor {name!r} holds experts, but config.json makes layer {idx} dense")
        return mlp.experts

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """:meth:`LlamaForCausalLM.load_weights`, ``block_sparse_moe.`` names read as ``mlp.``,
        then every expert of every routed layer checked filled and handed to its method."""
        filled = super().load_weights((name.replace(".block_sparse_moe.", ".mlp."), t) for name, t in weights)
        missing = [w for layer in self.moe_layers() for w in layer.missing_weights()]
        if missing:
            raise ValueError(
                f"the checkpoint of {type(self).__name__} has no weights for {len(missing)} expert tensor(s), "
                f"e.g. {', '.join(missing[:6])}; is the checkpoint complete and does it match config.json?"
            )
        for layer in self.moe_layers():
            layer.finish_loading()
        layers = self.moe_layers()
        if layers:
            first = layers[0]
            how = (f"expert parallel: physical experts {first.local_start}-{first.local_start + first.num_local - 1} "
                   f"of {first.num_physical}" if first.ep_size > 1 else
                   f"every expert, intermediate {first.intermediate_size} of {first.intermediate_full}")
            logger.info("%d MoE layers, %d experts each (top-%d); this rank holds %s",
                        len(layers), first.num_logical, first.top_k, how)
        return filled | {name for name, _ in self.named_parameters() if self.loads_itself(name)}
