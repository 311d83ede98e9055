"""The MoE layer (worker): a router's choices through the experts this rank holds.

:class:`FusedMoE` holds the experts of one decoder layer and runs them through
``host_moe::fused_experts`` (:mod:`host.core.moe.fused_experts`). Where the experts live:

- **tensor parallel** (``-tp N``, default): every rank holds every expert with its
  intermediate dimension split N ways (gate/up rows, down columns), like a dense MLP; each rank
  adds a partial sum and the layer all-reduces it over the tensor-parallel group.
- **expert parallel** (``--enable-expert-parallel``): the ``ep_size`` ranks each hold whole
  experts, ``num_physical / ep_size`` of them; a token-choice whose expert lives elsewhere is
  skipped here (id ``-1``) and the all-reduce combines every rank's contribution.

Physical experts (EPLB, :mod:`host.core.moe.eplb`): with ``num_redundant`` extra slots there are
``num_physical = num_logical + num_redundant`` physical experts, each serving one logical
expert (``physical_to_logical``); a hot logical expert may have several replicas
(``logical_to_physical[l, :replica_count[l]]``), and a token-choice goes to replica
``(token * top_k + j) % replica_count`` — the same on every rank, so the ranks agree without
talking. Without redundancy and rearrangement the maps are the identity. When ``record_load``
is on, each forward adds the token-choices per physical expert to ``expert_load``.

Weights: ``w13 [E_local, 2 * I_local, H]`` (gate rows, then up rows) and ``w2 [E_local, H, I_local]``
(and ``w13_bias [E_local, 2 * I_local]``, ``w2_bias [E_local, H]`` for gpt-oss). :meth:`load_expert`
takes one logical expert's FULL checkpoint tensor and fills every local slot that serves it.
A quantization method with a ``get_moe_method`` may own the weights instead (GGUF keeps the
expert blocks quantized); it then creates, loads and applies them (``method``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from host.core.moe.fused_experts import check_activation, fused_experts
from host.core.moe.router import select_experts

PARTS = ("gate", "up", "down", "gate_up")


def initial_physical_to_logical(num_logical: int, num_physical: int) -> torch.Tensor:
    """The map before any rebalancing: physical slot ``p`` serves logical ``p % num_logical``
    (slots past the logical count replicate experts 0, 1, ...)."""
    return torch.arange(num_physical, dtype=torch.int64) % num_logical


def maps_from_physical(physical_to_logical: torch.Tensor, num_logical: int, max_replicas: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logical_to_physical [.., L, max_replicas] (-1 padded), replica_count [.., L])`` of a
    ``physical_to_logical [.., P]`` map (any leading dims; ``-1`` physical slots serve nothing).
    Replicas are listed in ascending physical order."""
    lead = physical_to_logical.shape[:-1]
    p2l = physical_to_logical.reshape(-1, physical_to_logical.shape[-1])
    l2p = torch.full((p2l.shape[0], num_logical, max_replicas), -1, dtype=torch.int64)
    counts = torch.zeros((p2l.shape[0], num_logical), dtype=torch.int64)
    for row in range(p2l.shape[0]):
        for phys, logical in enumerate(p2l[row].tolist()):
            if logical < 0:
                continue
            c = int(counts[row, logical])
            if c >= max_replicas:
                raise ValueError(f"logical expert {logical} has more than max_replicas={max_replicas} replicas")
            l2p[row, logical, c] = phys
            counts[row, logical] = c + 1
    return l2p.reshape(*lead, num_logical, max_replicas), counts.reshape(*lead, num_logical)


class FusedMoE(nn.Module):
    """One layer's routed experts. ``forward(x [T, H], router_logits [T, E]) -> [T, H]`` (the
    router's weighted sum of the experts' outputs, reduced over the group when sharded).

    ``router``: keyword arguments of :func:`select_experts` besides ``top_k``
    (``scoring``, ``renormalize``, ``num_expert_group``, ...). ``tp_rank``/``tp_size`` split
    each expert; ``ep_rank``/``ep_size`` (expert parallel) split the experts instead;
    ``reduce`` is the all-reduce over the group the partial sums come from (``None``: one rank,
    or the caller reduces)."""

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        dtype: torch.dtype,
        *,
        router: dict[str, Any] | None = None,
        activation: str = "silu",
        bias: bool = False,
        alpha: float = 1.702,
        limit: float = 7.0,
        tp_rank: int = 0,
        tp_size: int = 1,
        ep_rank: int = 0,
        ep_size: int = 1,
        num_redundant: int = 0,
        reduce: Any = None,
        method: Any = None,
        layer_name: str = "",
    ) -> None:
        super().__init__()
        self.num_logical, self.top_k, self.hidden_size = num_experts, top_k, hidden_size
        self.router_kw = dict(router or {})
        self.activation = check_activation(activation)
        self.alpha, self.limit = float(alpha), float(limit)
        self.layer_name = layer_name
        self.num_physical = num_experts + num_redundant
        if self.num_physical % ep_size:
            raise ValueError(
                f"{num_experts} experts + {num_redundant} redundant = {self.num_physical} physical experts do not split "
                f"evenly over {ep_size} expert-parallel ranks; choose num_redundant_experts so the sum divides by {ep_size}"
            )
        self.ep_rank, self.ep_size = ep_rank, ep_size
        self.num_local = self.num_physical // ep_size
        self.local_start = ep_rank * self.num_local
        if ep_size > 1 and tp_size > 1 and ep_size != tp_size:
            raise ValueError("expert parallelism spans the tensor-parallel ranks; ep_size must equal tp_size")
        self.split = tp_size if ep_size == 1 else 1  # ways each expert is split
        self.split_rank = tp_rank if ep_size == 1 else 0
        if intermediate_size % self.split:
            raise ValueError(
                f"moe_intermediate_size {intermediate_size} does not split over {self.split} tensor-parallel ranks; "
                f"use a -tp that divides it, or --enable-expert-parallel to split whole experts instead"
            )
        self.intermediate_full = intermediate_size
        self.intermediate_size = intermediate_size // self.split
        self.reduce = reduce
        self.method = method
        inter = self.intermediate_size
        if method is None:
            self.w13 = nn.Parameter(torch.empty(self.num_local, 2 * inter, hidden_size, dtype=dtype), requires_grad=False)
            self.w2 = nn.Parameter(torch.empty(self.num_local, hidden_size, inter, dtype=dtype), requires_grad=False)
        else:
            method.create_weights(self, self.num_local, hidden_size, inter, dtype)
        if bias:
            self.w13_bias = nn.Parameter(torch.zeros(self.num_local, 2 * inter, dtype=dtype), requires_grad=False)
            self.w2_bias = nn.Parameter(torch.zeros(self.num_local, hidden_size, dtype=dtype), requires_grad=False)
        else:
            self.w13_bias = self.w2_bias = None
        # the physical-expert maps (EPLB rewrites them in place) and the load counter
        max_replicas = num_redundant + 1
        p2l = initial_physical_to_logical(num_experts, self.num_physical)
        l2p, counts = maps_from_physical(p2l, num_experts, max_replicas)
        self.register_buffer("physical_to_logical", p2l, persistent=False)
        self.register_buffer("logical_to_physical", l2p, persistent=False)
        self.register_buffer("replica_count", counts, persistent=False)
        self.register_buffer("expert_load", torch.zeros(self.num_physical, dtype=torch.int64), persistent=False)
        self.record_load = False
        self._filled: set[tuple[int, str]] = set()

    # -- routing ------------------------------------------------------------------------------
    @property
    def redundant(self) -> bool:
        return self.num_physical != self.num_logical

    def physical_ids(self, logical_ids: torch.Tensor) -> torch.Tensor:
        """The physical expert each token-choice goes to (int64, same shape)."""
        if not self.redundant and self.logical_to_physical.shape[-1] == 1:
            return self.logical_to_physical[logical_ids.long(), 0]
        logical = logical_ids.long()
        spread = torch.arange(logical.numel(), device=logical.device).view_as(logical)
        replica = spread % self.replica_count[logical]
        return self.logical_to_physical[logical, replica]

    def local_ids(self, physical: torch.Tensor) -> torch.Tensor:
        """Local slot ids (int32) of physical ids, ``-1`` where the expert is on another rank."""
        local = physical - self.local_start
        if self.ep_size > 1:
            local = torch.where((local >= 0) & (local < self.num_local), local, torch.full_like(local, -1))
        return local.to(torch.int32)

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        weights, ids = select_experts(router_logits, self.top_k, weights_dtype=x.dtype, **self.router_kw)
        physical = self.physical_ids(ids)
        if self.record_load:
            self.expert_load += torch.bincount(physical.reshape(-1), minlength=self.num_physical)
        local = self.local_ids(physical)
        if self.method is not None:
            out = self.method.apply(self, x, weights, local)
        else:
            out = fused_experts(
                x, self.w13, self.w2, weights, local, self.activation, self.w13_bias, self.w2_bias, self.alpha, self.limit
            )
        if self.reduce is not None:
            out = self.reduce(out)
        return out

    # -- weights ------------------------------------------------------------------------------
    def slot_tensors(self) -> list[torch.Tensor]:
        """The tensors with one row per local slot (``[num_local, ...]``): what moves when EPLB
        gives a slot another expert. A quantization method's experts move only if the method
        lists its own (``method.slot_tensors(layer)``)."""
        if self.method is not None:
            tensors = getattr(self.method, "slot_tensors", None)
            if tensors is None:
                raise ValueError(
                    f"{self.layer_name}: the {type(self.method).__name__} experts cannot be moved between slots, so "
                    "--enable-eplb cannot rebalance them; turn EPLB off for this quantization"
                )
            return tensors(self)
        return [t.data for t in (self.w13, self.w2, self.w13_bias, self.w2_bias) if t is not None]

    def local_slots_of(self, logical: int) -> list[int]:
        """The local slots serving logical expert ``logical`` (none when it lives elsewhere)."""
        p2l = self.physical_to_logical[self.local_start : self.local_start + self.num_local].tolist()
        return [slot for slot, owner in enumerate(p2l) if owner == logical]

    def _split_rows(self, tensor: torch.Tensor) -> torch.Tensor:
        n = self.intermediate_size
        return tensor[self.split_rank * n : (self.split_rank + 1) * n]

    def load_expert(self, logical: int, part: str, tensor: Any) -> None:
        """Load logical expert ``logical``'s FULL checkpoint tensor for ``part``: ``gate`` / ``up``
        ``[I, H]``, ``gate_up`` ``[2I, H]`` (gate rows first), ``down`` ``[H, I]``, or their biases
        (``gate_up_bias`` ``[2I]``, ``down_bias`` ``[H]``). This rank keeps its split; an expert
        living on another rank is skipped."""
        if not 0 <= logical < self.num_logical:
            raise ValueError(f"{self.layer_name}: expert {logical} is outside the {self.num_logical} experts of config.json")
        if part == "gate_up":
            half = tensor.shape[0] // 2
            self.load_expert(logical, "gate", tensor[:half])
            self.load_expert(logical, "up", tensor[half:])
            return
        if part == "gate_up_bias":
            half = tensor.shape[0] // 2
            self.load_expert(logical, "gate_bias", tensor[:half])
            self.load_expert(logical, "up_bias", tensor[half:])
            return
        self._filled.add((logical, part))
        slots = self.local_slots_of(logical)
        if not slots:
            return
        if self.method is not None and not part.endswith("_bias"):
            for slot in slots:
                self.method.load_expert(self, slot, part, tensor)
            return
        if hasattr(tensor, "dequantize") and not isinstance(tensor, torch.Tensor):
            tensor = tensor.dequantize(self.w13.dtype if self.method is None else torch.float32)
        inter = self.intermediate_size
        for slot in slots:
            if part in ("gate", "up"):
                dest = self.w13.data[slot, :inter] if part == "gate" else self.w13.data[slot, inter:]
                src = self._split_rows(tensor)
            elif part == "down":
                dest, src = self.w2.data[slot], self._split_rows(tensor.t()).t()
            elif part in ("gate_bias", "up_bias"):
                dest = self.w13_bias.data[slot, :inter] if part == "gate_bias" else self.w13_bias.data[slot, inter:]
                src = self._split_rows(tensor)
            elif part == "down_bias":
                # every split adds the bias once in the all-reduced sum: only split rank 0 keeps it
                dest, src = self.w2_bias.data[slot], tensor if self.split_rank == 0 else torch.zeros_like(tensor)
            else:
                raise ValueError(f"{self.layer_name}: unknown expert weight part {part!r}; one of {PARTS} or their _bias")
            if tuple(dest.shape) != tuple(src.shape):
                raise ValueError(
                    f"{self.layer_name}: expert {logical} {part} has shape {tuple(tensor.shape)}, which does not fit "
                    f"{tuple(dest.shape)} on this rank; the weights do not match config.json"
                )
            dest.copy_(src)

    def missing_weights(self) -> list[str]:
        """The ``expert.part`` weights no checkpoint tensor filled yet (empty when complete)."""
        parts = ["gate", "up", "down"] + (["gate_bias", "up_bias", "down_bias"] if self.w13_bias is not None else [])
        return [f"{self.layer_name}.experts.{e}.{p}" for e in range(self.num_logical) for p in parts if (e, p) not in self._filled]

    def finish_loading(self) -> None:
        """Hand the loaded weights to the method (repacking); the float path needs nothing."""
        if self.method is not None:
            self.method.process_weights_after_loading(self)

