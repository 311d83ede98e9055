"""The BERT encoder's attention layout: prompts attended alone or in tightly padded groups give
the same output as attending each prompt by itself."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from host.core.models.bert import BertSelfAttention, PromptLayout


def _qsl(lens):
    return np.concatenate([[0], np.cumsum(lens)])


@pytest.mark.parametrize("lens", [[7], [5, 5, 5], [30, 29, 28, 3, 64, 1, 2, 2, 17, 60, 61], list(range(1, 40))])
def test_every_token_is_attended_once_with_little_padding(lens):
    layout = PromptLayout(_qsl(lens), torch.device("cpu"))
    covered = [t for start, end in layout.slices for t in range(start, end)]
    for index, src, dst, mask in layout.groups:
        covered += dst.tolist()
        real = dst.numel()
        assert index.shape[0] >= 2
        assert layout.PAD_SHARE * (index.numel() - real) <= real  # padding at most 1/8 of the real tokens
        assert (mask is None) == (index.numel() == real)
        assert torch.equal(index.reshape(-1)[src], dst)
    assert sorted(covered) == list(range(sum(lens)))


@pytest.mark.parametrize("lens", [[9, 9, 9, 9], [40, 38, 37, 5, 1, 12, 12, 11, 70]])
def test_grouped_attention_equals_each_prompt_alone(lens):
    torch.manual_seed(0)
    cfg = SimpleNamespace(hidden_size=64, num_attention_heads=4)
    attn = BertSelfAttention(cfg, torch.float32)
    torch.nn.init.normal_(attn.qkv.weight, std=0.2)
    n = sum(lens)
    x = torch.randn(n, 64)
    layout = PromptLayout(_qsl(lens), torch.device("cpu"))
    assert layout.groups, "the case must exercise padded groups"
    got = attn(x, layout)
    qkv = attn.qkv(x).view(n, 3, 4, 16)
    for start, end in zip(_qsl(lens)[:-1], _qsl(lens)[1:]):
        q, k, v = (qkv[start:end, i].transpose(0, 1) for i in range(3))
        want = F.scaled_dot_product_attention(q, k, v).transpose(0, 1).reshape(end - start, 64)
        torch.testing.assert_close(got[start:end], want, rtol=1e-5, atol=1e-5)
