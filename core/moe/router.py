"""Which experts each token goes to, and with what weight (worker).

:func:`select_experts` covers the routers of the MoE families host serves:

- ``scoring="softmax"``: softmax over every expert, the ``top_k`` largest kept, optionally
  renormalised to sum to 1 (Mixtral, Qwen2/3-MoE with ``norm_topk_prob``, OLMoE). gpt-oss takes the
  top-k of the logits and a softmax over those k — the same numbers as softmax + renormalise.
- ``scoring="sigmoid"``: DeepSeek-V3's router. Each expert scores ``sigmoid(logit)``; the choice
  adds a per-expert ``correction_bias`` (load balancing without an auxiliary loss); with
  ``num_expert_group`` groups a token first keeps the ``topk_group`` groups whose two best biased
  scores sum highest, then its top-k experts within them. The weights are the unbiased scores of
  the chosen experts, renormalised when asked, times ``routed_scaling_factor``.

The result is ``(weights float32 [T, k], ids int32 [T, k])``; ids are logical expert ids.
"""

from __future__ import annotations

import torch

SCORING = ("softmax", "sigmoid")


def select_experts(
    router_logits: torch.Tensor,
    top_k: int,
    *,
    scoring: str = "softmax",
    renormalize: bool = False,
    num_expert_group: int | None = None,
    topk_group: int | None = None,
    correction_bias: torch.Tensor | None = None,
    routed_scaling_factor: float = 1.0,
    weights_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-``top_k`` experts of each row of ``router_logits [T, E]`` and their weights.

    ``weights_dtype``: the dtype the weights are rounded through before they are returned as
    float32 (the reference models round softmax weights to the logits' dtype; ``None`` keeps
    float32). Raises ``ValueError`` for a bad ``scoring``, ``top_k`` or group setting."""
    if scoring not in SCORING:
        raise ValueError(f"scoring={scoring!r} is not a router; use one of {SCORING}")
    num_experts = router_logits.shape[-1]
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k={top_k} must be between 1 and the number of experts ({num_experts})")
    logits = router_logits.float()
    if scoring == "softmax":
        probs = torch.softmax(logits, dim=-1)
        weights, ids = torch.topk(probs, top_k, dim=-1)
        if renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
    else:
        scores = logits.sigmoid()
        choice = scores if correction_bias is None else scores + correction_bias.float()
        if num_expert_group and num_expert_group > 1:
            choice = _mask_to_best_groups(choice, num_expert_group, topk_group or num_expert_group)
        ids = torch.topk(choice, top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, ids)
        if renormalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        weights = weights * routed_scaling_factor
    if weights_dtype is not None:
        weights = weights.to(weights_dtype)
    return weights.float(), ids.to(torch.int32)


def _mask_to_best_groups(choice: torch.Tensor, num_groups: int, topk_group: int) -> torch.Tensor:
    """``choice`` with every expert outside each row's ``topk_group`` best groups set to -inf; a
    group's score is the sum of its two best experts' scores."""
    tokens, num_experts = choice.shape
    if num_experts % num_groups:
        raise ValueError(f"n_group={num_groups} must divide the number of experts ({num_experts})")
    if not 1 <= topk_group <= num_groups:
        raise ValueError(f"topk_group={topk_group} must be between 1 and n_group={num_groups}")
    grouped = choice.view(tokens, num_groups, num_experts // num_groups)
    group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1)[0].sum(dim=-1)
    best = torch.topk(group_scores, topk_group, dim=-1, sorted=False)[1]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
    return grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view(tokens, num_experts)
