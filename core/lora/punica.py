"""The batched multi-adapter LoRA product (worker): one shrink/expand pass per layer over the
whole step, each token with its own adapter slot (Punica's idea, S-LoRA's serving).

Every wrapped linear holds stacked slot buffers ``a [max_loras, in, R]`` (each slot's A
transposed) and ``b [max_loras, R, out]`` (B transposed, already multiplied by the adapter's
scale); ``R`` is the slices' ranks side by side (see :mod:`host.core.lora.layers`). Stored
transposed, both products read contiguous rows (a transposed view costs several times more in
bfloat16 on the CPU). For the step's :class:`LoRAMapping` (the slot of each token, ``-1`` for
the base model) the op adds, in place, ``out[t] += (x[t] @ a[s]) @ b[s]`` for every token ``t``
whose slot ``s >= 0``.

The op is called through the kernel table (:mod:`host.interfaces.kernels`) as
``lora_shrink_expand(x, out, a, b, mapping, active) -> out``: the torch path below is the core's
reference for every device (``"*"``, offered by :func:`offer_kernels` when the table is filled,
see :mod:`host.core.kernels`); a platform offers a faster one for its device type through the
``host_offer_kernels`` hook (``plugins/triton_ops/lora.py`` for ``cuda``). ``active[s]`` is False where slot ``s`` holds
nothing for this module (an adapter that does not target it): those tokens are skipped.

The torch path has three shapes, chosen per call from the step's grouping (made once per step,
host-side, in :func:`build_mapping`):

- one adapter for every token: ``out += (x @ a[s]) @ b[s]``, two GEMMs, no gather;
- one adapter and base tokens: the same over that adapter's rows (a gather and a scatter-add);
- several adapters: ONE shrink over every slot's A side by side (``x @ [a_0 | a_1 | ...]``), each
  token's row masked to its own slot's ranks, then ONE expand over the B's stacked
  (``h @ [b_0; b_1; ...]``). The FLOPs grow with ``max_loras`` (small), the number of calls does
  not: on the CPU the calls, not the FLOPs, are what a rank-16 product costs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

from host.interfaces.kernels import ANY_DEVICE, kernel_for

OP = "lora_shrink_expand"


@dataclass
class LoRAMapping:
    """One step's adapter slot per input token.

    ``token_slots``: int32 ``[num_tokens]`` on the device (``-1``: the base model);
    ``groups``: ``(slot, row indices on the device, or None for every row)`` per slot the step
    uses, built once per step; ``num_tokens``: the step's token count."""

    token_slots: torch.Tensor
    groups: list[tuple[int, torch.Tensor | None]]
    num_tokens: int
    _masks: dict[tuple[Any, ...], torch.Tensor] = field(default_factory=dict, repr=False)

    def slot_mask(self, num_slots: int, rank: int, dtype: torch.dtype) -> torch.Tensor:
        """``[num_tokens, num_slots * rank]``: 1 where the column belongs to the token's slot (built
        once per step for each buffer width, shared by the layers)."""
        key = (num_slots, rank, dtype)
        mask = self._masks.get(key)
        if mask is None:
            cols = torch.arange(num_slots * rank, device=self.token_slots.device) // rank
            mask = (self.token_slots.long()[:, None] == cols[None, :]).to(dtype)
            self._masks[key] = mask
        return mask


def build_mapping(token_slots: np.ndarray, device: torch.device) -> LoRAMapping | None:
    """The mapping of a step from each token's slot (host int array, ``-1`` base); ``None``
    when no token uses an adapter (the wrappers then add nothing and cost one check)."""
    token_slots = np.asarray(token_slots, dtype=np.int32)
    used = np.unique(token_slots)
    used = used[used >= 0]
    if used.size == 0:
        return None
    groups: list[tuple[int, torch.Tensor | None]] = []
    if used.size == 1 and bool((token_slots == used[0]).all()):
        groups.append((int(used[0]), None))
    else:
        for slot in used.tolist():
            rows = np.flatnonzero(token_slots == slot)
            groups.append((int(slot), torch.from_numpy(rows).to(device, non_blocking=True)))
    slots = torch.from_numpy(token_slots).to(device, non_blocking=True)
    return LoRAMapping(slots, groups, int(token_slots.shape[0]))


def lora_shrink_expand_torch(
    x: torch.Tensor, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, mapping: LoRAMapping,
    active: Sequence[bool] | None = None,
) -> torch.Tensor:
    """The reference (every device): ``out[t] += (x[t] @ a[s]) @ b[s]`` for each token's slot
    ``s``, in ``x``'s dtype (as PEFT computes ``lora_B(lora_A(x))``); see the module docstring."""
    groups = mapping.groups if active is None else [(s, rows) for s, rows in mapping.groups if active[s]]
    if not groups:
        return out
    if len(groups) == 1:
        slot, rows = groups[0]
        if rows is None:
            out.addmm_(x @ a[slot], b[slot])  # the expand and the add in one call
        else:
            out.index_add_(0, rows, (x.index_select(0, rows) @ a[slot]) @ b[slot])
        return out
    # several adapters: slots this module leaves untargeted are zero, base rows are masked out
    num_slots, k, r = a.shape
    a_all = a.transpose(0, 1).reshape(k, num_slots * r)  # a view of LoRALinear's [in, slots, R] storage
    h = (x @ a_all).mul_(mapping.slot_mask(num_slots, r, x.dtype))
    out.addmm_(h, b.reshape(num_slots * r, -1))
    return out


def offer_kernels(register: Callable[..., None]) -> None:
    """Offer the torch path as the op's reference for every device (called by the code that
    fills the kernel table, never at import)."""
    register(OP, ANY_DEVICE, lora_shrink_expand_torch, name="torch",
             reason="torch, in the core: grouped shrink/expand GEMMs")


def lora_shrink_expand(
    x: torch.Tensor, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, mapping: LoRAMapping,
    active: Sequence[bool] | None = None,
) -> torch.Tensor:
    """``out`` plus each token's adapter product, by the kernel table's best implementation for
    ``x``'s device (see the module docstring); returns ``out``."""
    impl: Any = kernel_for(OP, x.device.type)
    return impl(x, out, a, b, mapping, active)
