"""``torch_paged``: paged attention in plain torch ops over a block-paged KV cache, on any device.

It is the CPU platform's algorithm (``cpu_paged`` is this backend plus a compiled decode kernel)
and the fallback the GPU platforms list after their Triton kernels, for shapes those refuse.

Why it looks the way it does: on a CPU, decode attention is bound by memory traffic, not
arithmetic, and every torch op costs a few microseconds of dispatch. So the work per layer is a
handful of large ops per *group* of requests, never per token:

1. the new K/V rows are scattered into the cache with one ``index_copy_`` each;
2. for each group, the group's K and V pages are gathered with one ``index_select`` of whole
   blocks into a reusable workspace (``[2, reqs, padded_len, kv_heads, head_size]``);
3. one ``scaled_dot_product_attention`` call (torch's fused CPU flash kernel; its softmax and
   accumulators are float32 also for bfloat16 inputs) runs over the padded group with a
   precomputed additive mask, or with ``is_causal`` when the group is fresh prompts of one length.
   For decode-like groups the query heads that share a KV head are folded into extra query rows
   of that head, so each KV page is streamed once per KV head rather than once per query head.

Everything that depends only on the batch layout (the groups, gather indices, query->token maps,
masks) is computed once per step by
:class:`~host.plugins.torch_paged.metadata.TorchPagedAttentionMetadataBuilder` and shared by all
layers (how requests are grouped is said there).

**fp8 pages** (``--kv-cache-dtype fp8``: the cache tensor is ``float8_e4m3fn``): a K row is stored
as ``e4m3(clamp(k / k_scale, +-448))`` and read back as ``page.to(model dtype) * k_scale`` (V
alike with ``v_scale``); the scales are the impl's ``k_scale`` / ``v_scale``, fixed for the
engine's life (docs/quantization.md, "fp8 KV cache", says why). Pages move as ``uint8`` views
(CPU torch has no ``index_copy_`` for float8), and the gathered fp8 pages are widened into a
second workspace of the model dtype before the attention call, so SDPA never sees fp8.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F

from host.plugins.torch_paged.metadata import (
    PagedAttentionGroup,
    TorchPagedAttentionMetadata,
    TorchPagedAttentionMetadataBuilder,
)
from host.sdk.attention import AttentionBackend, AttentionImpl, AttentionMetadataBuilder, MultipleOf

_FOLD_MAX_QUERY_LEN = 16  # up to this many query rows per request, fold GQA heads into rows
FP8_KV_DTYPES = ("fp8", "fp8_e4m3")  # the --kv-cache-dtype values meaning float8_e4m3fn pages
_FP8_MAX = 448.0  # largest finite float8_e4m3fn


def is_fp8_cache(kv_cache: torch.Tensor) -> bool:
    """Whether ``kv_cache`` holds fp8 pages (``--kv-cache-dtype fp8``)."""
    return kv_cache.dtype == torch.float8_e4m3fn


def quantize_kv(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``x`` as float8_e4m3fn pages with ``value = stored * scale``: divided by ``scale``,
    clamped to the finite range (+-448: no NaN for an outlier) and rounded to nearest."""
    x = x.float()
    if scale != 1.0:
        x = x / scale
    return x.clamp_(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn)


def explicit_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
    cap: float | None = None, sinks: torch.Tensor | None = None, is_causal: bool = False,
) -> torch.Tensor:
    """``scaled_dot_product_attention`` with what the fused kernel cannot do, the logits written
    out: tanh soft-capping (Gemma 2, ``cap``: ``cap * tanh(scale * q k^T / cap)`` before the mask)
    and attention sinks (gpt-oss, ``sinks``: one more logit per query row joins the softmax,
    with no value, so the probabilities over the keys sum to less than 1). The logits and the
    softmax are float32 (the probabilities cast back to ``v``'s dtype before the product, as the
    Hugging Face references do). ``q`` ``[..., heads, Lq, D]``; ``k``/``v`` ``[..., kv_heads, Lk, D]``
    with ``heads`` a multiple of ``kv_heads`` (grouped-query heads are repeated); ``mask``
    additive, broadcastable to the logits, or ``None``; ``sinks`` broadcastable to ``[...,
    heads, Lq, 1]``; ``is_causal``: SDPA's causal mask (query row ``i`` sees keys ``0..i``; fresh
    prompts, where the two lengths are equal)."""
    rep = q.shape[-3] // k.shape[-3]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=-3)
        v = v.repeat_interleave(rep, dim=-3)
    logits = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    if is_causal:
        lq, lk = logits.shape[-2], logits.shape[-1]
        future = torch.ones(lq, lk, dtype=torch.bool, device=q.device).triu(1)
        logits = logits.masked_fill(future, float("-inf"))
    if mask is not None:
        logits = logits + mask.float()
    if sinks is None:
        probs = torch.softmax(logits, dim=-1)
    else:
        sink = sinks.float().expand(*logits.shape[:-1], 1)
        probs = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
    return torch.matmul(probs.to(v.dtype), v)


def dequantize_kv(pages: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """fp8 ``pages`` back in ``dtype``: ``pages.to(dtype) * scale`` (exact for bfloat16 and
    float32 at scale 1: every e4m3 value is representable in both)."""
    out = pages.to(dtype)
    return out.mul_(scale) if scale != 1.0 else out


class TorchPagedAttentionImpl(AttentionImpl):
    """Writes K/V through the slot mapping, then runs one fused attention call per group.

    With ``logits_soft_cap`` or ``sinks`` set the call is :func:`explicit_attention` (the logits
    soft-capped before the mask, the sink logits joining the softmax; the same grouping, masks
    and folding) instead of the fused SDPA kernel.

    ``k_scale`` / ``v_scale`` are this layer's fp8 scales (used only when the cache is fp8):
    1.0 unless set before the first step, and never changed afterwards (pages already written,
    prefix-cached ones included, are read with the same scale)."""

    k_scale: float = 1.0
    v_scale: float = 1.0
    supports_logits_soft_cap = True
    supports_sinks = True

    def _sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
              is_causal: bool = False, enable_gqa: bool = False, folded: int = 0) -> torch.Tensor:
        """One attention call over a group: the fused SDPA kernel, or :func:`explicit_attention`
        for soft-capping or sinks. ``folded``: ``q`` holds ``folded`` query rows per KV head, the
        GQA heads folded in (row ``m * rep + r`` of KV head ``h`` is query head ``h * rep + r``);
        0: ``q`` is ``[..., heads, Lq, D]``."""
        if self.logits_soft_cap is not None or self.sinks is not None:
            sinks = None
            if self.sinks is not None:
                heads = self.sinks.shape[0]
                if folded:
                    kv_heads = k.shape[-3]
                    rep = heads // kv_heads
                    sinks = self.sinks.view(kv_heads, 1, rep).expand(kv_heads, folded // rep, rep).reshape(kv_heads, folded, 1)
                else:
                    sinks = self.sinks.view(heads, 1, 1)
            return explicit_attention(q, k, v, mask, self.scale, self.logits_soft_cap, sinks, is_causal=is_causal)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=self.scale, enable_gqa=enable_gqa)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: TorchPagedAttentionMetadata | None,
        output: torch.Tensor | None = None,
    ) -> torch.Tensor:
        output, n = self.prepare_output(query, attn_metadata, output)
        if n is None:
            return output
        md = attn_metadata
        self._write_kv(key[:n], value[:n], kv_cache, md)
        for group in md.groups:
            self._attend(group, query, kv_cache, md, output)
        return output

    def _write_kv(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, md: TorchPagedAttentionMetadata) -> None:
        if md.write_slots.numel() == 0:
            return
        k_flat = kv_cache[0].view(-1, kv_cache.shape[-2], kv_cache.shape[-1])
        v_flat = kv_cache[1].view(-1, kv_cache.shape[-2], kv_cache.shape[-1])
        if md.write_token_index is not None:
            key = key.index_select(0, md.write_token_index)
            value = value.index_select(0, md.write_token_index)
        if is_fp8_cache(kv_cache):  # moved as bytes: CPU torch has no float8 index_copy_
            k_flat.view(torch.uint8).index_copy_(0, md.write_slots, quantize_kv(key, self.k_scale).view(torch.uint8))
            v_flat.view(torch.uint8).index_copy_(0, md.write_slots, quantize_kv(value, self.v_scale).view(torch.uint8))
            return
        k_flat.index_copy_(0, md.write_slots, key.to(kv_cache.dtype))
        v_flat.index_copy_(0, md.write_slots, value.to(kv_cache.dtype))

    def _attend(
        self,
        g: PagedAttentionGroup,
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        md: TorchPagedAttentionMetadata,
        output: torch.Tensor,
    ) -> None:
        n, mq, heads, hd = g.num_reqs, g.max_query_len, self.num_heads, self.head_size
        kv_heads, bs = kv_cache.shape[-2], kv_cache.shape[2]
        rep = heads // kv_heads
        fp8 = is_fp8_cache(kv_cache)
        cache = kv_cache.view(torch.uint8) if fp8 else kv_cache  # fp8 pages are gathered as bytes
        compute_dtype = query.dtype if fp8 else kv_cache.dtype
        dev = kv_cache.device  # the group's index tensors are built on the host: moved once per step

        # 1. gather the group's pages into the workspace: [2, n * blocks, bs, kv_heads, hd]
        kv = md.workspace.get("kv", (2, g.kv_block_ids.numel(), bs, kv_heads, hd), cache.dtype, dev)
        if cache.is_contiguous():  # K and V pages in one op
            pages = cache.view(-1, bs, kv_heads, hd)
            ids = g.on(("pages", cache.shape[1]), g.kv_page_ids(cache.shape[1]), dev)
            torch.index_select(pages, 0, ids, out=kv.view(-1, bs, kv_heads, hd))
        else:
            block_ids = g.on("kv_block_ids", g.kv_block_ids, dev)
            torch.index_select(cache[0], 0, block_ids, out=kv[0])
            torch.index_select(cache[1], 0, block_ids, out=kv[1])
        if fp8:  # widen into the model dtype, scales applied: [2, n * blocks, bs, kv_heads, hd]
            wide = md.workspace.get("kv_wide", tuple(kv.shape), compute_dtype, dev)
            wide.copy_(kv.view(torch.float8_e4m3fn))
            if self.k_scale != 1.0:
                wide[0].mul_(self.k_scale)
            if self.v_scale != 1.0:
                wide[1].mul_(self.v_scale)
            kv = wide
        kv = kv.view(2, n, g.num_kv_blocks * bs, kv_heads, hd)[:, :, : g.kv_len]
        k = kv[0].transpose(1, 2)  # [n, kv_heads, kv_len, hd]: a strided view, no copy
        v = kv[1].transpose(1, 2)

        # 2. this group's query rows: [n, mq, heads, hd]
        if g.query_token_range is not None:
            q = query[g.query_token_range[0] : g.query_token_range[1]]
        else:
            q = query.index_select(0, g.on("query_token_index", g.query_token_index, query.device))
        q = q.to(compute_dtype).view(n, mq, heads, hd)

        # 3. one fused call (float32 softmax and accumulation inside the kernel)
        if g.use_is_causal and self.sliding_window is None:
            out = self._sdpa(q.transpose(1, 2), k, v, is_causal=True, enable_gqa=rep > 1)
            out = out.transpose(1, 2)  # [n, mq, heads, hd]
        elif mq <= _FOLD_MAX_QUERY_LEN:
            # Decode-like: the `rep` query heads sharing a KV head become extra query rows of
            # that head, so each KV page is streamed once per KV head with rep * mq rows.
            q = q.view(n, mq, kv_heads, rep, hd).permute(0, 2, 1, 3, 4).reshape(n, kv_heads, mq * rep, hd)
            mask = g.on(("mask", self.sliding_window, q.dtype, rep), g.mask(self.sliding_window, q.dtype, rep), dev)
            out = self._sdpa(q, k, v, mask, folded=mq * rep)
            out = out.view(n, kv_heads, mq, rep, hd).permute(0, 2, 1, 3, 4)  # [n, mq, kv, rep, hd]
        else:
            mask = g.on(("mask", self.sliding_window, q.dtype, 1), g.mask(self.sliding_window, q.dtype, 1), dev)
            out = self._sdpa(q.transpose(1, 2), k, v, mask, enable_gqa=rep > 1)
            out = out.transpose(1, 2)
        out = out.reshape(n * mq, heads, hd)

        # 4. scatter the real rows back to their batch tokens
        if g.output_rows is not None:
            out = out.index_select(0, g.on("output_rows", g.output_rows, dev))
        if g.query_token_range is not None:
            output[g.query_token_range[0] : g.query_token_range[1]].copy_(out)
        else:
            output.index_copy_(0, g.on("output_token_index", g.output_token_index, output.device), out.to(output.dtype))


class TorchPagedAttentionBackend(AttentionBackend):
    """``torch_paged``: the paged backend in plain torch (gathered pages + SDPA), for any
    device — the fallback a GPU platform lists after its kernels, for shapes they refuse.

    Any positive block size works (``MultipleOf(1)``). Supports sliding windows, attention logit
    soft-capping, attention sinks, prefix caching (context already in the cache) and mixed prefill/decode batches.
    The per-layer cache is
    ``(2, num_blocks, block_size, num_kv_heads, head_size)``, in the model dtype or, with
    ``--kv-cache-dtype fp8``, float8_e4m3fn (torch converts in software: any device).
    """

    name: ClassVar[str] = "torch_paged"
    device_types: ClassVar[tuple[str, ...]] = ("cuda", "cpu")
    supported_dtypes: ClassVar[tuple[str, ...]] = ("float32", "bfloat16", "float16")
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("auto", *FP8_KV_DTYPES)
    supported_head_sizes: ClassVar[tuple[int, ...] | None] = None
    block_size_constraint: ClassVar[MultipleOf] = MultipleOf(1)
    supports_sliding_window: ClassVar[bool] = True
    supports_logits_soft_cap: ClassVar[bool] = True
    supports_sinks: ClassVar[bool] = True
    supports_prefix_caching: ClassVar[bool] = True
    supports_mixed_batches: ClassVar[bool] = True

    # KV layout: the base class's (2, num_blocks, block_size, num_kv_heads, head_size)

    @classmethod
    def get_impl_cls(cls) -> type[AttentionImpl]:
        return TorchPagedAttentionImpl

    @classmethod
    def get_builder_cls(cls) -> type[AttentionMetadataBuilder]:
        return TorchPagedAttentionMetadataBuilder
