"""Token sampling over the whole batch with tensor operations.

This covers greedy decoding and temperature / top-k / top-p sampling with per-request seeds;
penalties, logit bias and structured outputs extend it in the sampling issue.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

_GREEDY_EPS = 1e-5


class Sampler:
    """Picks one token per row of ``logits`` according to each request's sampling params."""

    def __init__(self) -> None:
        self._generators: dict[int, torch.Generator] = {}

    def __call__(self, logits: torch.Tensor, params: Sequence[Any], output_ids: Sequence[list[int]]) -> torch.Tensor:
        logits = logits.float()
        greedy_tokens = logits.argmax(dim=-1)
        temps = [float(getattr(p, "temperature", 0.0)) for p in params]
        if all(t < _GREEDY_EPS for t in temps):
            return greedy_tokens
        temp = torch.tensor([t if t >= _GREEDY_EPS else 1.0 for t in temps], device=logits.device)
        scaled = logits / temp[:, None]
        top_k = torch.tensor([int(getattr(p, "top_k", 0) or 0) for p in params], device=logits.device)
        top_p = torch.tensor([float(getattr(p, "top_p", 1.0)) for p in params], device=logits.device)
        scaled = _apply_top_k_top_p(scaled, top_k, top_p)
        probs = scaled.softmax(dim=-1)
        sampled = self._sample(probs, params, output_ids)
        is_greedy = torch.tensor([t < _GREEDY_EPS for t in temps], device=logits.device)
        return torch.where(is_greedy, greedy_tokens, sampled)

    def _sample(self, probs: torch.Tensor, params: Sequence[Any], output_ids: Sequence[list[int]]) -> torch.Tensor:
        # exponential-race sampling: argmax(p / q) with q ~ Exp(1) is a draw from p; seeded rows
        # use their own generator so results do not depend on batch composition
        q = torch.empty_like(probs).exponential_()
        for i, p in enumerate(params):
            seed = getattr(p, "seed", None)
            if seed is not None:
                gen = torch.Generator(device=probs.device)
                gen.manual_seed(int(seed) + len(output_ids[i]))
                q[i].exponential_(generator=gen)
        return (probs / q).argmax(dim=-1)


def _apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    if bool((top_k > 0).any()) or bool((top_p < 1.0).any()):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        vocab = logits.shape[-1]
        ranks = torch.arange(vocab, device=logits.device)[None, :]
        k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))
        mask = ranks >= k[:, None]
        probs = sorted_logits.softmax(dim=-1)
        cum = probs.cumsum(dim=-1) - probs  # mass before this token
        mask |= cum > top_p[:, None]
        sorted_logits = sorted_logits.masked_fill(mask, float("-inf"))
        logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)
    return logits
