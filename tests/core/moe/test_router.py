"""The routers against transformers' own: softmax top-k (Mixtral / Qwen3-MoE with and without
renormalising) and DeepSeek-V3's sigmoid grouped top-k with the correction bias and routed
scaling; and the fused experts op's registration (opcheck: schema, fake implementation)."""

from __future__ import annotations

import pytest
import torch
import transformers

from host.core.moe.router import select_experts


def _sorted(weights: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    order = ids.long().sort(dim=-1).indices
    return weights.gather(1, order), ids.long().gather(1, order)


@pytest.mark.parametrize("norm", [False, True])
def test_softmax_top_k_matches_qwen3_moe(norm: bool) -> None:
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    config = transformers.Qwen3MoeConfig(hidden_size=32, num_experts=16, num_experts_per_tok=4, norm_topk_prob=norm)
    router = Qwen3MoeTopKRouter(config)
    torch.nn.init.normal_(router.weight, std=0.5)
    x = torch.randn(11, 32)
    _, ref_w, ref_ids = router(x)
    w, ids = select_experts(x @ router.weight.t(), 4, renormalize=norm)
    a, b = _sorted(w, ids), _sorted(ref_w.float(), ref_ids)
    assert torch.equal(a[1], b[1]) and torch.allclose(a[0], b[0], atol=1e-6)


def test_sigmoid_grouped_top_k_matches_deepseek_v3() -> None:
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    config = transformers.DeepseekV3Config(hidden_size=32, n_routed_experts=16, num_experts_per_tok=4, n_group=4,
                                           topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5)
    router = DeepseekV3TopkRouter(config)
    torch.nn.init.normal_(router.weight, std=0.5)
    router.e_score_correction_bias.copy_(torch.randn(16) * 0.3)
    x = torch.randn(13, 32)
    _, ref_w, ref_ids = router(x)
    w, ids = select_experts(x @ router.weight.t(), 4, scoring="sigmoid", renormalize=True, num_expert_group=4,
                            topk_group=2, correction_bias=router.e_score_correction_bias, routed_scaling_factor=2.5)
    a, b = _sorted(w, ids), _sorted(ref_w.float(), ref_ids)
    assert torch.equal(a[1], b[1]) and torch.allclose(a[0], b[0], atol=1e-6)
    # the groups matter: without them another expert set wins for some token
    _, ungrouped = select_experts(x @ router.weight.t(), 4, scoring="sigmoid", correction_bias=router.e_score_correction_bias)
    assert not torch.equal(_sorted(w, ungrouped)[1], a[1])


def test_bad_router_settings_are_named() -> None:
    logits = torch.randn(3, 8)
    with pytest.raises(ValueError, match="scoring='relu'"):
        select_experts(logits, 2, scoring="relu")
    with pytest.raises(ValueError, match="top_k=9"):
        select_experts(logits, 9)
    with pytest.raises(ValueError, match="n_group=3"):
        select_experts(logits, 2, scoring="sigmoid", num_expert_group=3, topk_group=1)


def test_fused_experts_op_passes_opcheck() -> None:
    from host.core.moe.fused_experts import fused_experts
    from host.core.plugins.manager import get_plugin_host
    from host.core.plugins.platform import current_platform

    get_plugin_host().offer_kernels(current_platform())
    g = torch.Generator().manual_seed(0)
    args = (torch.randn(5, 16, generator=g), torch.randn(4, 16, 16, generator=g), torch.randn(4, 16, 8, generator=g),
            torch.rand(5, 2, generator=g), torch.tensor([[0, 1], [2, 3], [1, -1], [3, 0], [2, 2]], dtype=torch.int32), "silu")
    torch.library.opcheck(fused_experts, args, test_utils=("test_schema", "test_faketensor"))
