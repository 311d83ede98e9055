"""One step's batch layout for the ``torch_paged`` algorithm, built once and shared by every
layer: the groups of requests attended together, their gather indices, query->token maps and
masks (see :mod:`host.plugins.torch_paged.attention` for why the work is grouped).

Requests are grouped so padding stays cheap: sorted by query length then sequence length, a new
group starts when a request's query or sequence length falls well below the group's maximum.
A batch of decodes is therefore a few groups of similar context length, and a long prefill
chunk sits in its own. Masks for a sliding window are built on first use and cached on the
group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from host.sdk.attention import AttentionBackend, AttentionMetadataBuilder, CommonAttentionMetadata

# Grouping heuristics (see ``_split_into_groups``).
_GROUP_LEN_RATIO = 0.75  # start a new group when a length drops below this share of the group max
_GROUP_SHORT_QUERY_LEN = 64  # longer queries are grouped only with queries of the same length
_GROUP_MIN_REQS = 8  # a sequence-length cut needs at least this many requests in the group
_GROUP_MAX_MASK_ELEMS = 1 << 22  # cap on reqs * padded_query_len * padded_kv_len per group
_MASKED = -1e30  # additive mask value (fits bf16); finite so fully masked tiles never give NaN


class _Workspace:
    """Grow-only scratch buffers shared by every layer of a step (no per-layer allocations).

    Large fresh allocations on CPU are served by ``mmap`` and pay a page fault per 4 KiB on first
    touch; reusing one buffer across layers avoids that on every call.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype, bool, torch.device], torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | None = None) -> torch.Tensor:
        """A view ``shape`` of the buffer ``name`` of ``dtype`` on ``device`` (the CPU when not given)."""
        numel = 1
        for s in shape:
            numel *= s
        device = torch.device("cpu") if device is None else torch.device(device)
        key = (name, dtype, torch.is_inference_mode_enabled(), device)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype, device=device)
            self._buffers[key] = buf
        return buf[:numel].view(shape)


@dataclass
class PagedAttentionGroup:
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

    def decode_tables(self, md: "TorchPagedAttentionMetadata") -> tuple[torch.Tensor, torch.Tensor]:
        """int32 block-table rows and sequence lengths of this group's requests (built on
        first use, then shared by every layer)."""
        key = ("decode_tables",)
        if key not in self._cache:
            tables = md.block_table.index_select(0, self.req_indices).to(torch.int32).contiguous()
            lens = md.seq_lens.index_select(0, self.req_indices).to(torch.int32).contiguous()
            self._cache[key] = (tables, lens)  # type: ignore[assignment]
        return self._cache[key]  # type: ignore[return-value]

    def on(self, key: Any, tensor: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
        """``tensor`` (built on the host) on the cache's ``device``: copied once per step and
        shared by every layer; the tensor itself on the CPU."""
        if tensor is None or tensor.device == device:
            return tensor
        cache_key = ("on", key, device)
        moved = self._cache.get(cache_key)
        if moved is None:
            moved = self._cache[cache_key] = tensor.to(device)
        return moved

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
class TorchPagedAttentionMetadata:
    """Everything one step's attention needs, built once and shared by all layers.

    ``write_slots`` are the cache slots (flattened ``block_id * block_size + offset``) the new
    tokens' K/V go to; ``write_token_index`` selects which batch tokens are written (``None``:
    tokens ``0..len(write_slots)``, i.e. no ``-1`` slots were present). ``groups`` partition
    the requests that have query tokens this step; they are built on first use (about 50 small
    tensor ops, 0.5 ms on a 2-core CPU), so a step that never reads them (a decode step the
    CPU's compiled ``llama_decode_step`` runs whole) never pays for them.
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
    num_blocks_needed: torch.Tensor  # int64 [num_reqs]  pages each sequence spans
    workspace: _Workspace = field(default_factory=_Workspace, repr=False)
    _groups: list[PagedAttentionGroup] | None = field(default=None, repr=False)

    @property
    def groups(self) -> list[PagedAttentionGroup]:
        if self._groups is None:
            query_lens = self.query_start_loc[1:] - self.query_start_loc[:-1]
            self._groups = [
                TorchPagedAttentionMetadataBuilder._build_group(
                    idx, self.query_start_loc, query_lens, self.seq_lens, self.context_lens, self.num_blocks_needed,
                    self.block_table, self.block_size, self.causal,
                )
                for idx in _split_into_groups(query_lens, self.seq_lens)
            ]
        return self._groups


class TorchPagedAttentionMetadataBuilder(AttentionMetadataBuilder):
    """Turns :class:`CommonAttentionMetadata` into :class:`TorchPagedAttentionMetadata`."""

    def __init__(self, backend: type[AttentionBackend], device: Any) -> None:
        super().__init__(backend, device)
        self._workspace = _Workspace()  # survives across steps when the runner keeps the builder

    def build(self, common: CommonAttentionMetadata) -> TorchPagedAttentionMetadata:
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

        return TorchPagedAttentionMetadata(
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
            num_blocks_needed=num_blocks_needed,
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
    ) -> PagedAttentionGroup:
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
        return PagedAttentionGroup(
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
