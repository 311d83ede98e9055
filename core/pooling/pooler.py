"""The pooler: one step's last hidden states -> one vector per prompt (worker process).

:meth:`Pooler.pool` reduces each prompt's rows of the flattened hidden states with the
model's :class:`~host.core.pooling.config.PoolerConfig` (MEAN over the prompt's tokens, CLS =
its first token, LAST = its last token), vectorised over the batch. :meth:`Pooler.finish`
applies each request's :class:`~host.contracts.pooling_params.PoolingParams`: ``dimensions``
(Matryoshka truncation) and then L2 normalisation (``normalize``, or the model's default for
``embed`` / ``score``; ``encode`` returns the raw vector unless asked). Vectors are float32.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from host.contracts.pooling_params import PoolingParams
from host.core.pooling.config import PoolerConfig


class Pooler:
    """Pools with one :class:`PoolerConfig` (the model's)."""

    def __init__(self, config: PoolerConfig) -> None:
        self.config = config

    def pool(self, hidden: torch.Tensor, num_tokens: np.ndarray) -> torch.Tensor:
        """[num_prompts, hidden_size] float32 from ``hidden`` [sum(num_tokens), hidden_size],
        whose rows are the prompts' tokens one prompt after another (``num_tokens`` each)."""
        counts = torch.as_tensor(np.asarray(num_tokens, dtype=np.int64), device=hidden.device)
        ends = torch.cumsum(counts, 0)
        kind = self.config.pooling_type
        if kind == "CLS":
            return hidden[ends - counts].float()
        if kind == "LAST":
            return hidden[ends - 1].float()
        # MEAN: a segment sum in float32, divided by each prompt's token count
        owner = torch.repeat_interleave(torch.arange(len(counts), device=hidden.device), counts)
        sums = torch.zeros(len(counts), hidden.shape[-1], dtype=torch.float32, device=hidden.device)
        sums.index_add_(0, owner, hidden.float())
        return sums / counts[:, None].float()

    def normalizes(self, params: PoolingParams) -> bool:
        """Whether ``params``' vector is L2-normalized."""
        if params.normalize is not None:
            return params.normalize
        return self.config.normalize if params.task in ("embed", "score") else False

    def finish(self, pooled: torch.Tensor, params: list[PoolingParams]) -> list[list[float]]:
        """Each row truncated to its request's ``dimensions`` and normalized as it asks."""
        out: list[list[float]] = []
        for row, p in zip(pooled, params):
            if p.dimensions is not None:
                row = row[: p.dimensions]
            if self.normalizes(p):
                row = F.normalize(row, p=2, dim=-1)
            out.append(row)
        if not out:
            return []
        if all(len(r) == len(out[0]) for r in out):
            return torch.stack(out).cpu().tolist()
        return [r.cpu().tolist() for r in out]
