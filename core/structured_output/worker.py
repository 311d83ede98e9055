"""The worker's side of structured outputs: the engine core's bitmask rows as a boolean mask
(the model runner and the speculative verify step apply it before any other logits processor)."""

from __future__ import annotations

import torch


def bitmask_to_bool(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """Unpack int32 bitmask rows ``[n, words]`` into bool ``[n, vocab]`` (True = allowed)."""
    shifts = torch.arange(32, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab].bool()
