"""The attention layer models use: projections live in the model, this does the attention.

Inside the model runner (a :class:`ForwardContext` is set) it delegates to the selected
backend's :class:`AttentionImpl`, which writes K/V into the paged cache and attends over pages.
Outside it (no context: a quick single-sequence forward, e.g. in a unit test or a profiling
run) it computes plain causal attention over the given tokens as one sequence.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from host.contracts.forward_context import get_forward_context
from host.interfaces.attention import AttentionBackend


@torch.library.custom_op("host::attention", mutates_args=("output",))
def attention_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, output: torch.Tensor, layer_idx: int) -> None:
    """Layer ``layer_idx``'s paged attention as one opaque op, for compiled models: the KV-cache
    write and the attention run in the backend, reading the forward context at run time, so
    ``torch.compile`` traces the rest of the model around it (piecewise around attention)."""
    ctx = get_forward_context()
    if ctx is None:
        raise RuntimeError("host::attention runs only inside the model runner (no forward context)")
    layer = ctx.extra["attention_layers"][layer_idx]
    n = query.shape[0]
    out = layer.impl.forward(
        query.view(n, layer.num_heads, layer.head_size),
        key.view(n, layer.num_kv_heads, layer.head_size),
        value.view(n, layer.num_kv_heads, layer.head_size),
        ctx.kv_caches[layer_idx],
        ctx.metadata_of(layer_idx),
    )
    output.copy_(out.reshape(output.shape))


@attention_op.register_fake
def _(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, output: torch.Tensor, layer_idx: int) -> None:
    return None


class Attention(nn.Module):
    """Multi-head / grouped-query attention over the paged KV cache of layer ``layer_idx``.

    ``sliding_window`` (``None``: none): a query at position ``p`` sees keys at ``p - window + 1
    .. p``. ``logits_soft_cap`` (``None``: off): the scaled logits become ``cap * tanh(logit /
    cap)`` before the mask and the softmax (Gemma 2); the backend's impl is asked for it at
    construction and refuses when it cannot compute it. ``sinks`` (gpt-oss): the layer holds a
    learned sink logit per query head (``self.sinks``, float32 ``[num_heads]``, filled at load),
    whose ``exp`` joins each head's softmax denominator without a value; the impl gets the
    parameter at construction (and refuses it when it cannot add sinks).
    """

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        num_kv_heads: int,
        scale: float,
        layer_idx: int,
        backend: type[AttentionBackend] | None = None,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
        sinks: bool = False,
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_attention_heads={num_heads} must be a multiple of num_key_value_heads={num_kv_heads}"
            )
        self.num_heads = num_heads
        self.head_size = head_size
        self.num_kv_heads = num_kv_heads
        self.scale = scale
        self.layer_idx = layer_idx
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap
        self.sinks = nn.Parameter(torch.zeros(num_heads, dtype=torch.float32), requires_grad=False) if sinks else None
        # the positional contract every impl takes; the optional features only when the layer has them
        extra = {} if logits_soft_cap is None else {"logits_soft_cap": logits_soft_cap}
        if self.sinks is not None:
            extra["sinks"] = self.sinks
        if backend is None:
            self.impl = None
        else:
            self.impl = backend.get_impl_cls()(num_heads, head_size, scale, num_kv_heads, sliding_window, **extra)

    # set by the model runner when the model is compiled: attention then goes through the
    # opaque ``host::attention`` op (always inside a forward context)
    opaque: bool = False

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``q``: [num_tokens, num_heads * head_size]; ``k``/``v``: [num_tokens, num_kv_heads *
        head_size]. Returns [num_tokens, num_heads * head_size]."""
        n = q.shape[0]
        if self.opaque:
            output = torch.empty(n, self.num_heads * self.head_size, dtype=q.dtype, device=q.device)
            torch.ops.host.attention(q.contiguous(), k.contiguous(), v.contiguous(), output, self.layer_idx)
            return output
        q = q.view(n, self.num_heads, self.head_size)
        k = k.view(n, self.num_kv_heads, self.head_size)
        v = v.view(n, self.num_kv_heads, self.head_size)
        ctx = get_forward_context()
        if ctx is None or self.impl is None:
            out = self._dense_causal(q, k, v)
        else:
            out = self.impl.forward(q, k, v, ctx.kv_caches[self.layer_idx], ctx.metadata_of(self.layer_idx))
        return out.reshape(n, self.num_heads * self.head_size)

    def _dense_causal(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        n = q.shape[0]
        rep = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        if self.sliding_window is not None:
            idx = torch.arange(n, device=q.device)
            mask &= (idx[:, None] - idx[None, :]) < self.sliding_window
        if self.logits_soft_cap is not None or self.sinks is not None:  # SDPA can do neither: the logits written out
            logits = torch.matmul(q.transpose(0, 1).float(), k.transpose(0, 1).float().transpose(-1, -2)) * self.scale
            if self.logits_soft_cap is not None:
                cap = self.logits_soft_cap
                logits = torch.tanh(logits / cap) * cap
            logits = logits.masked_fill(~mask, float("-inf"))
            if self.sinks is None:
                probs = torch.softmax(logits, dim=-1)
            else:  # the sink's logit joins each head's softmax as one more column, then is dropped
                sink = self.sinks.float().view(-1, 1, 1).expand(-1, n, 1)
                probs = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
            return torch.matmul(probs.to(v.dtype), v.transpose(0, 1)).transpose(0, 1)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=self.scale
        )
        return out.transpose(0, 1)
