"""The CPU paged-attention backend: torch ops over a block-paged KV cache.

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
masks) is computed once per step by :class:`CpuPagedAttentionMetadataBuilder` and shared by all
layers; masks for a sliding window are built on first use and cached on the metadata.

Requests are grouped so padding stays cheap: sorted by query length then sequence length, a new
group starts when a request's query or sequence length falls well below the group's maximum.
A batch of decodes is therefore a few groups of similar context length, and a long prefill
chunk sits in its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from host.plugins.builtin_cpu.kernels import paged_decode_kernel
from host.sdk.attention import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
    MultipleOf,
)

# Grouping heuristics (see ``_split_into_groups``).
_GROUP_LEN_RATIO = 0.75  # start a new group when a length drops below this share of the group max
_GROUP_SHORT_QUERY_LEN = 64  # longer queries are grouped only with queries of the same length
_GROUP_MIN_REQS = 8  # a sequence-length cut needs at least this many requests in the group
_GROUP_MAX_MASK_ELEMS = 1 << 22  # cap on reqs * padded_query_len * padded_kv_len per group
_FOLD_MAX_QUERY_LEN = 16  # up to this many query rows per request, fold GQA heads into rows
_MASKED = -1e30  # additive mask value (fits bf16); finite so fully masked tiles never give NaN


class _Workspace:
    """Grow-only scratch buffers shared by every layer of a step (no per-layer allocations).

    Large fresh allocations on CPU are served by ``mmap`` and pay a page fault per 4 KiB on first
    touch; reusing one buffer across layers avoids that on every call.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype, bool], torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        numel = 1
        for s in shape:
            numel *= s
        key = (name, dtype, torch.is_inference_mode_enabled())
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype)
            self._buffers[key] = buf
        return buf[:numel].view(shape)


@dataclass
class CpuAttentionGroup:
    """Requests attended together by one fused kernel call, padded to common lengths.

    Query rows are padded to ``max_query_len`` per request and KV to ``kv_len`` positions (the
    longest sequence of the group). Padded query rows repeat the request's last real row and are
    dropped when the output is scattered back.
    """

    req_indices: torch.Tensor  # int64 [n]   rows of the batch this group covers
    num_reqs: int
    max_query_len: int  # padded query rows per request
    num_kv_blocks: int  # blocks gathered per request
    kv_len: int  # positions attended per request (<= num_kv_blocks * block_size)
    kv_block_ids: torch.Tensor  # int64 [n * num_kv_blocks]  pages to gather, row-major by request
    query_positions: torch.Tensor  # int64 [n, max_query_len]  absolute position of each row
    seq_lens: torch.Tensor  # int64 [n]
    query_token_range: tuple[int, int] | None  # set when the rows are batch tokens start:end
    query_token_index: torch.Tensor  # int64 [n * max_query_len]  batch token of each padded row
    output_rows: torch.Tensor | None  # int64 [m]  real rows among the padded ones (None: all)
    output_token_index: torch.Tensor  # int64 [m]  batch token each real row is written to
    causal: bool
    use_is_causal: bool  # fresh prompts of equal length: kernel-native causal mask, no tensor
    # filled on first use by the first layer of a step: masks, K+V page ids
    _cache: dict[tuple[Any, ...], torch.Tensor | None] = field(default_factory=dict, repr=False)

    def decode_tables(self, md: "CpuPagedAttentionMetadata") -> tuple[torch.Tensor, torch.Tensor]:
        """int32 block-table rows and sequence lengths of this group's requests (built on
        first use, then shared by every layer)."""
        key = ("decode_tables",)
        if key not in self._cache:
            tables = md.block_table.index_select(0, self.req_indices).to(torch.int32).contiguous()
            lens = md.seq_lens.index_select(0, self.req_indices).to(torch.int32).contiguous()
            self._cache[key] = (tables, lens)  # type: ignore[assignment]
        return self._cache[key]  # type: ignore[return-value]

    def kv_page_ids(self, num_blocks: int) -> torch.Tensor:
        """Page ids into the cache viewed as ``[2 * num_blocks, ...]``: K pages, then V pages."""
        key = ("pages", num_blocks)
        ids = self._cache.get(key)
        if ids is None:
            ids = self._cache[key] = torch.cat((self.kv_block_ids, self.kv_block_ids + num_blocks))
        return ids

    def mask(self, sliding_window: int | None, dtype: torch.dtype, rows_per_query: int) -> torch.Tensor | None:
        """Additive mask ``[n, 1, max_query_len * rows_per_query, kv_len]`` in ``dtype`` (None when
        nothing is masked), each query row repeated ``rows_per_query`` times (for query heads
        folded into rows). Built on first use per variant, then shared by every layer."""
        key = (sliding_window, dtype, rows_per_query)
        if key not in self._cache:
            allowed = self._cache.get((sliding_window, "allowed"))
            if allowed is None:
                allowed = self._cache[(sliding_window, "allowed")] = self._allowed(sliding_window)
            if bool(allowed.all()):
                self._cache[key] = None
            else:
                if rows_per_query > 1:
                    allowed = allowed.repeat_interleave(rows_per_query, dim=1)
                bias = torch.zeros(allowed.shape, dtype=dtype)
                bias.masked_fill_(~allowed, _MASKED)
                self._cache[key] = bias.unsqueeze(1)
        return self._cache[key]

    def _allowed(self, sliding_window: int | None) -> torch.Tensor:
        """Bool ``[n, max_query_len, kv_len]``: which positions each query row may attend."""
        kpos = torch.arange(self.kv_len, dtype=torch.int64).view(1, 1, -1)
        qpos = self.query_positions.unsqueeze(-1)  # [n, q, 1]
        if self.causal:
            allowed = kpos <= qpos  # implies kpos < seq_len: query rows never exceed it
            if sliding_window is not None:
                allowed &= kpos > qpos - sliding_window
        else:
            allowed = kpos < self.seq_lens.view(-1, 1, 1)
            if sliding_window is not None:
                allowed &= (kpos - qpos).abs() < sliding_window
        return allowed


@dataclass
class CpuPagedAttentionMetadata:
    """Everything one step's attention needs, built once and shared by all layers.

    ``write_slots`` are the cache slots (flattened ``block_id * block_size + offset``) the new
    tokens' K/V go to; ``write_token_index`` selects which batch tokens are written (``None``:
    tokens ``0..len(write_slots)``, i.e. no ``-1`` slots were present). ``groups`` partition
    the requests that have query tokens this step.
    """

    num_actual_tokens: int
    num_reqs: int
    max_query_len: int
    max_seq_len: int
    block_size: int
    causal: bool
    query_start_loc: torch.Tensor  # int64 [num_reqs + 1]
    seq_lens: torch.Tensor  # int64 [num_reqs]
    context_lens: torch.Tensor  # int64 [num_reqs]  tokens already in the cache
    block_table: torch.Tensor  # int32 [num_reqs, max_blocks]
    slot_mapping: torch.Tensor  # int64 [num_actual_tokens]
    write_slots: torch.Tensor  # int64 [num_writes]
    write_token_index: torch.Tensor | None  # int64 [num_writes]
    groups: list[CpuAttentionGroup]
    workspace: _Workspace = field(default_factory=_Workspace, repr=False)


class CpuPagedAttentionMetadataBuilder(AttentionMetadataBuilder):
    """Turns :class:`CommonAttentionMetadata` into :class:`CpuPagedAttentionMetadata`."""

    def __init__(self, backend: type[AttentionBackend], device: Any) -> None:
        super().__init__(backend, device)
        self._workspace = _Workspace()  # survives across steps when the runner keeps the builder

    def build(self, common: CommonAttentionMetadata) -> CpuPagedAttentionMetadata:
        num_reqs = common.num_reqs
        n_tok = common.num_actual_tokens
        bs = common.block_size
        qsl_src = common.query_start_loc_cpu if common.query_start_loc_cpu is not None else common.query_start_loc
        seq_src = common.seq_lens_cpu if common.seq_lens_cpu is not None else common.seq_lens
        qsl = qsl_src[: num_reqs + 1].to("cpu", torch.int64)
        seq_lens = seq_src[:num_reqs].to("cpu", torch.int64)
        query_lens = qsl[1:] - qsl[:-1]
        context_lens = seq_lens - query_lens
        if bool((context_lens < 0).any()):
            raise ValueError("seq_lens must be >= query lengths (seq_len = context_len + query_len)")
        block_table = common.block_table[:num_reqs]
        num_blocks_needed = (seq_lens + bs - 1) // bs
        if num_reqs and int(num_blocks_needed.max()) > block_table.shape[1]:
            raise ValueError(
                f"block_table has {block_table.shape[1]} columns but a sequence of "
                f"{int(seq_lens.max())} tokens needs {int(num_blocks_needed.max())} blocks of {bs}"
            )

        slot_mapping = common.slot_mapping[:n_tok].to(torch.int64)
        valid = slot_mapping >= 0
        if bool(valid.all()):
            write_slots, write_token_index = slot_mapping, None
        else:
            write_token_index = valid.nonzero().view(-1)
            write_slots = slot_mapping[write_token_index]

        groups = [
            self._build_group(
                idx, qsl, query_lens, seq_lens, context_lens, num_blocks_needed, block_table, bs, common.causal
            )
            for idx in _split_into_groups(query_lens, seq_lens)
        ]
        return CpuPagedAttentionMetadata(
            num_actual_tokens=n_tok,
            num_reqs=num_reqs,
            max_query_len=common.max_query_len,
            max_seq_len=common.max_seq_len,
            block_size=bs,
            causal=common.causal,
            query_start_loc=qsl,
            seq_lens=seq_lens,
            context_lens=context_lens,
            block_table=block_table,
            slot_mapping=slot_mapping,
            write_slots=write_slots,
            write_token_index=write_token_index,
            groups=groups,
            workspace=self._workspace,
        )

    @staticmethod
    def _build_group(
        req_indices: torch.Tensor,
        qsl: torch.Tensor,
        query_lens: torch.Tensor,
        seq_lens: torch.Tensor,
        context_lens: torch.Tensor,
        num_blocks_needed: torch.Tensor,
        block_table: torch.Tensor,
        block_size: int,
        causal: bool,
    ) -> CpuAttentionGroup:
        n = req_indices.numel()
        q_lens = query_lens[req_indices]
        s_lens = seq_lens[req_indices]
        starts = qsl[req_indices]
        nblk = num_blocks_needed[req_indices]
        max_q = int(q_lens.max())
        kv_len = int(s_lens.max())
        num_kv_blocks = int(nblk.max())

        cols = torch.arange(num_kv_blocks, dtype=torch.int64)
        table = block_table[req_indices.to(block_table.device), :num_kv_blocks].to("cpu", torch.int64)
        # Columns past a request's last page may hold stale ids: point them at block 0, which
        # always exists; the mask hides those positions.
        table = torch.where(cols.view(1, -1) < nblk.view(-1, 1), table, torch.zeros_like(table))

        rows = torch.arange(max_q, dtype=torch.int64).view(1, -1)
        real = rows < q_lens.view(-1, 1)  # [n, max_q]
        row_in_req = torch.minimum(rows, (q_lens - 1).view(-1, 1))  # padded rows repeat the last
        token_index = (starts.view(-1, 1) + row_in_req).view(-1)
        positions = context_lens[req_indices].view(-1, 1) + row_in_req

        all_real = bool(real.all())
        token_range = None
        if all_real and n * max_q > 0:
            first = int(token_index[0])
            if bool((token_index == torch.arange(first, first + n * max_q)).all()):
                token_range = (first, first + n * max_q)
        if all_real:
            output_rows, output_tokens = None, token_index
        else:
            output_rows = real.view(-1).nonzero().view(-1)
            output_tokens = token_index[output_rows]
        # fresh prompts of one length: the kernel's own causal mask, which skips masked tiles
        use_is_causal = causal and max_q > 1 and all_real and bool((context_lens[req_indices] == 0).all())
        return CpuAttentionGroup(
            req_indices=req_indices,
            num_reqs=n,
            max_query_len=max_q,
            num_kv_blocks=num_kv_blocks,
            kv_len=kv_len,
            kv_block_ids=table.reshape(-1),
            query_positions=positions,
            seq_lens=s_lens,
            query_token_range=token_range,
            query_token_index=token_index,
            output_rows=output_rows,
            output_token_index=output_tokens,
            causal=causal,
            use_is_causal=use_is_causal,
        )


def _split_into_groups(query_lens: torch.Tensor, seq_lens: torch.Tensor) -> list[torch.Tensor]:
    """Partition the requests with query tokens into groups of similar shape.

    Requests are sorted by query length, then sequence length (both descending); a group is closed
    when the next request's query length is below ``_GROUP_LEN_RATIO`` of the group's (or differs
    at all from a query longer than ``_GROUP_SHORT_QUERY_LEN``: padded query rows are real work),
    when its sequence length is below that share of the group's longest once the group holds
    ``_GROUP_MIN_REQS`` requests, or when the padded mask would exceed ``_GROUP_MAX_MASK_ELEMS``.
    The loop runs once per step over host ints (a cut depends on the group so far, so there is
    no closed vectorised form); everything per token stays in tensor ops.
    """
    active = (query_lens > 0).nonzero().view(-1)
    if active.numel() == 0:
        return []
    # lexicographic sort (query_len desc, seq_len desc) via two stable sorts
    order = active[torch.sort(seq_lens[active], descending=True, stable=True).indices]
    order = order[torch.sort(query_lens[order], descending=True, stable=True).indices]
    q_list = query_lens[order].tolist()
    s_list = seq_lens[order].tolist()
    groups: list[torch.Tensor] = []
    start = 0
    g_q, g_s = q_list[0], s_list[0]
    for i in range(1, len(q_list)):
        q, s = q_list[i], s_list[i]
        count = i - start
        new_s = max(g_s, s)
        cut = (
            q < _GROUP_LEN_RATIO * g_q
            or (g_q > _GROUP_SHORT_QUERY_LEN and q != g_q)
            or (count >= _GROUP_MIN_REQS and s < _GROUP_LEN_RATIO * g_s)
            or (count + 1) * g_q * new_s > _GROUP_MAX_MASK_ELEMS
        )
        if cut:
            groups.append(order[start:i])
            start, g_q, g_s = i, q, s
        else:
            g_s = new_s
    groups.append(order[start:])
    # keep batch order inside a group so contiguous decode runs can use a plain slice
    return [g.sort().values for g in groups]


class CpuPagedAttentionImpl(AttentionImpl):
    """Writes K/V through the slot mapping, then runs one fused attention call per group."""

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: CpuPagedAttentionMetadata | None,
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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # built (or found in the build cache) once per process, at model construction
        self._decode_kernel = paged_decode_kernel()

    def _attend_decode_kernel(
        self,
        g: CpuAttentionGroup,
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        md: CpuPagedAttentionMetadata,
        output: torch.Tensor,
    ) -> None:
        """Single-token queries: the compiled kernel reads the pages in place (no gather)."""
        if g.query_token_range is not None:
            q = query[g.query_token_range[0] : g.query_token_range[1]]
        else:
            q = query.index_select(0, g.query_token_index)
        q = q.reshape(g.num_reqs, self.num_heads, self.head_size).contiguous()
        tables, lens = g.decode_tables(md)
        out = self._decode_kernel(q, kv_cache[0], kv_cache[1], tables, lens, self.scale, self.sliding_window or 0)
        if g.query_token_range is not None:
            output[g.query_token_range[0] : g.query_token_range[1]].copy_(out)
        else:
            output.index_copy_(0, g.output_token_index, out)

    @staticmethod
    def _write_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, md: CpuPagedAttentionMetadata) -> None:
        if md.write_slots.numel() == 0:
            return
        k_flat = kv_cache[0].view(-1, kv_cache.shape[-2], kv_cache.shape[-1])
        v_flat = kv_cache[1].view(-1, kv_cache.shape[-2], kv_cache.shape[-1])
        if md.write_token_index is not None:
            key = key.index_select(0, md.write_token_index)
            value = value.index_select(0, md.write_token_index)
        k_flat.index_copy_(0, md.write_slots, key.to(kv_cache.dtype))
        v_flat.index_copy_(0, md.write_slots, value.to(kv_cache.dtype))

    def _attend(
        self,
        g: CpuAttentionGroup,
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        md: CpuPagedAttentionMetadata,
        output: torch.Tensor,
    ) -> None:
        n, mq, heads, hd = g.num_reqs, g.max_query_len, self.num_heads, self.head_size
        kv_heads, bs = kv_cache.shape[-2], kv_cache.shape[2]
        rep = heads // kv_heads
        if mq == 1 and g.causal and self._decode_kernel is not None and kv_cache.dtype == torch.float32 and kv_cache.device.type == "cpu":
            self._attend_decode_kernel(g, query, kv_cache, md, output)
            return

        # 1. gather the group's pages into the workspace: [2, n * blocks, bs, kv_heads, hd]
        kv = md.workspace.get("kv", (2, g.kv_block_ids.numel(), bs, kv_heads, hd), kv_cache.dtype)
        if kv_cache.is_contiguous():  # K and V pages in one op
            pages = kv_cache.view(-1, bs, kv_heads, hd)
            ids = g.kv_page_ids(kv_cache.shape[1])
            torch.index_select(pages, 0, ids, out=kv.view(-1, bs, kv_heads, hd))
        else:
            torch.index_select(kv_cache[0], 0, g.kv_block_ids, out=kv[0])
            torch.index_select(kv_cache[1], 0, g.kv_block_ids, out=kv[1])
        kv = kv.view(2, n, g.num_kv_blocks * bs, kv_heads, hd)[:, :, : g.kv_len]
        k = kv[0].transpose(1, 2)  # [n, kv_heads, kv_len, hd]: a strided view, no copy
        v = kv[1].transpose(1, 2)

        # 2. this group's query rows: [n, mq, heads, hd]
        if g.query_token_range is not None:
            q = query[g.query_token_range[0] : g.query_token_range[1]]
        else:
            q = query.index_select(0, g.query_token_index)
        q = q.to(kv_cache.dtype).view(n, mq, heads, hd)

        # 3. one fused call (float32 softmax and accumulation inside the kernel)
        if g.use_is_causal and self.sliding_window is None:
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), k, v, is_causal=True, scale=self.scale, enable_gqa=rep > 1
            )
            out = out.transpose(1, 2)  # [n, mq, heads, hd]
        elif mq <= _FOLD_MAX_QUERY_LEN:
            # Decode-like: the `rep` query heads sharing a KV head become extra query rows of
            # that head, so each KV page is streamed once per KV head with rep * mq rows.
            q = q.view(n, mq, kv_heads, rep, hd).permute(0, 2, 1, 3, 4).reshape(n, kv_heads, mq * rep, hd)
            mask = g.mask(self.sliding_window, q.dtype, rep)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
            out = out.view(n, kv_heads, mq, rep, hd).permute(0, 2, 1, 3, 4)  # [n, mq, kv, rep, hd]
        else:
            mask = g.mask(self.sliding_window, q.dtype, 1)
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), k, v, attn_mask=mask, scale=self.scale, enable_gqa=rep > 1
            )
            out = out.transpose(1, 2)
        out = out.reshape(n * mq, heads, hd)

        # 4. scatter the real rows back to their batch tokens
        if g.output_rows is not None:
            out = out.index_select(0, g.output_rows)
        if g.query_token_range is not None:
            output[g.query_token_range[0] : g.query_token_range[1]].copy_(out)
        else:
            output.index_copy_(0, g.output_token_index, out.to(output.dtype))


class CpuPagedAttentionBackend(AttentionBackend):
    """Paged attention for the CPU platform, in plain torch ops (no compiled extension).

    Any positive block size works (``MultipleOf(1)``; 16 is the engine default). Supports
    sliding windows, prefix caching (context already in the cache) and mixed prefill/decode
    batches. The per-layer cache is ``(2, num_blocks, block_size, num_kv_heads, head_size)``.
    """

    name: ClassVar[str] = "cpu_paged"
    device_types: ClassVar[tuple[str, ...]] = ("cpu",)
    supported_dtypes: ClassVar[tuple[str, ...]] = ("float32", "bfloat16")
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("auto",)
    supported_head_sizes: ClassVar[tuple[int, ...] | None] = None
    block_size_constraint: ClassVar[MultipleOf] = MultipleOf(1)
    supports_sliding_window: ClassVar[bool] = True
    supports_prefix_caching: ClassVar[bool] = True
    supports_mixed_batches: ClassVar[bool] = True

    # KV layout: the base class's (2, num_blocks, block_size, num_kv_heads, head_size)

    @classmethod
    def get_impl_cls(cls) -> type[AttentionImpl]:
        return CpuPagedAttentionImpl

    @classmethod
    def get_builder_cls(cls) -> type[AttentionMetadataBuilder]:
        return CpuPagedAttentionMetadataBuilder


class TorchPagedAttentionImpl(CpuPagedAttentionImpl):
    """The same algorithm in torch ops only (no compiled CPU kernel): runs on any device."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        AttentionImpl.__init__(self, *args, **kwargs)
        self._decode_kernel = None


class TorchPagedAttentionBackend(CpuPagedAttentionBackend):
    """``torch_paged``: the paged backend in plain torch (gathered pages + SDPA), for any
    device — the fallback a GPU platform lists after its kernels, for shapes they refuse."""

    name: ClassVar[str] = "torch_paged"
    device_types: ClassVar[tuple[str, ...]] = ("cuda", "cpu")
    supported_dtypes: ClassVar[tuple[str, ...]] = ("float32", "bfloat16", "float16")

    @classmethod
    def get_impl_cls(cls) -> type[AttentionImpl]:
        return TorchPagedAttentionImpl

