"""The attention-backend suite: a backend's impl against plain paged attention, on random layouts."""

from __future__ import annotations

from typing import Any, ClassVar

from host.sdk.attention import AttentionBackend, AttentionRequirements, CommonAttentionMetadata
from host.sdk.conformance.base import RegistrationCheck


def reference_paged_attention(
    query: Any, key_cache: Any, value_cache: Any, block_table: Any, seq_lens: Any, query_start_loc: Any, scale: float,
) -> Any:
    """Causal attention of each request's new tokens over its whole sequence, read page by page.

    ``query`` is ``[tokens, heads, head_size]``; the caches are ``[blocks, block_size, kv_heads,
    head_size]``; request ``i``'s queries are the last ``query_start_loc[i+1] - query_start_loc[i]``
    positions of its ``seq_lens[i]`` tokens. Query heads share KV heads in groups of
    ``heads // kv_heads`` (GQA). Written for clarity, one request and one head group at a time, in
    float64."""
    import torch

    heads = query.shape[1]
    block_size, kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = heads // kv_heads
    out = torch.zeros(query.shape, dtype=torch.float64)
    for i in range(len(seq_lens)):
        start, end, seq_len = int(query_start_loc[i]), int(query_start_loc[i + 1]), int(seq_lens[i])
        n_blocks = -(-seq_len // block_size)
        pages = [int(b) for b in block_table[i, :n_blocks]]
        k = torch.cat([key_cache[b] for b in pages])[:seq_len].double()  # [seq, kv_heads, d]
        v = torch.cat([value_cache[b] for b in pages])[:seq_len].double()
        q = query[start:end].double()
        context = seq_len - (end - start)
        for h in range(heads):
            kh = k[:, h // group]
            scores = (q[:, h] @ kh.T) * scale  # [new, seq]
            rows = torch.arange(end - start).unsqueeze(1) + context
            scores = scores.masked_fill(torch.arange(seq_len).unsqueeze(0) > rows, float("-inf"))
            out[start:end, h] = scores.softmax(-1) @ v[:, h // group]
    return out


class AttentionBackendConformance(RegistrationCheck):
    """Checks an attention backend's impl against :func:`reference_paged_attention`.

    Set ``backend`` (the :class:`AttentionBackend` subclass). Optional: ``device`` ("cpu"),
    ``dtype`` ("float32"), ``block_size`` (the first size the backend accepts of 16, 32, 64),
    ``atol`` (2e-3 for float32). The layouts cover fresh prompts, prefix hits (a cached context
    before the new tokens), chunked prefill, decode, a mixed batch and GQA."""

    backend: ClassVar[type[AttentionBackend] | None] = None
    device: ClassVar[str] = "cpu"
    dtype: ClassVar[str] = "float32"
    block_size: ClassVar[int | None] = None
    atol: ClassVar[float] = 2e-3
    registry_kind = "attention_backends"
    group = "host.attention_backends"

    def registered_name(self) -> str:
        return self.backend.name

    # (context tokens already cached, new tokens) per request, per layout
    LAYOUTS: ClassVar[dict[str, list[tuple[int, int]]]] = {
        "prompts": [(0, 7), (0, 33)],
        "prefix_hits": [(32, 5), (16, 17)],
        "decode": [(40, 1), (3, 1), (17, 1)],
        "mixed": [(0, 9), (25, 1), (48, 12), (5, 1)],
    }

    def _block_size(self) -> int:
        if self.block_size is not None:
            return self.block_size
        for size in (16, 32, 64):
            if self.backend.block_size_constraint.accepts(size):
                return size
        raise AssertionError(f"{self.backend.name}: accepts none of the block sizes 16, 32, 64; set block_size")

    def test_declares_a_name_and_device_types(self) -> None:
        assert self.backend is not None, "set `backend` to your AttentionBackend subclass"
        assert isinstance(self.backend.name, str) and self.backend.name, "an attention backend needs a non-empty `name`"
        assert all(isinstance(d, str) for d in self.backend.device_types)
        described = self.backend.describe()
        assert described["name"] == self.backend.name

    def test_supports_its_declared_combination(self) -> None:
        req = AttentionRequirements(self.device, self.dtype, 64, self._block_size())
        assert self.backend.supports_combination(req) is None, self.backend.supports_combination(req)
        bad = AttentionRequirements(self.device, self.dtype, 64, self._block_size() + 1)
        reason = self.backend.supports_combination(bad)
        assert reason is None or isinstance(reason, str)

    def _run(self, layout: list[tuple[int, int]], heads: int, kv_heads: int, seed: int) -> tuple[Any, Any]:
        import torch

        gen = torch.Generator().manual_seed(seed)
        dtype, device, block_size, head_size = getattr(torch, self.dtype), torch.device(self.device), self._block_size(), 64
        max_blocks = max(-(-(c + n) // block_size) for c, n in layout)
        num_blocks = max_blocks * len(layout) + 3
        shape = self.backend.get_kv_cache_shape(num_blocks, block_size, kv_heads, head_size)
        kv_cache = torch.zeros(shape, dtype=dtype, device=device)
        # pages in a shuffled order, so a backend that ignores the block table fails
        order = torch.randperm(num_blocks - 1, generator=gen) + 1
        tables = torch.zeros(len(layout), max_blocks, dtype=torch.int32)
        for i, (c, n) in enumerate(layout):
            need = -(-(c + n) // block_size)
            tables[i, :need] = order[i * max_blocks : i * max_blocks + need].to(torch.int32)
        key_cache, value_cache = kv_cache[0], kv_cache[1]
        # the cached context goes straight into the pages (as earlier steps would have written it)
        for i, (c, _) in enumerate(layout):
            for p in range(c):
                b, off = int(tables[i, p // block_size]), p % block_size
                key_cache[b, off] = torch.randn(kv_heads, head_size, generator=gen).to(dtype)
                value_cache[b, off] = torch.randn(kv_heads, head_size, generator=gen).to(dtype)
        total = sum(n for _, n in layout)
        q = torch.randn(total, heads, head_size, generator=gen).to(dtype)
        k = torch.randn(total, kv_heads, head_size, generator=gen).to(dtype)
        v = torch.randn(total, kv_heads, head_size, generator=gen).to(dtype)
        slots, starts = [], [0]
        for i, (c, n) in enumerate(layout):
            for p in range(c, c + n):
                slots.append(int(tables[i, p // block_size]) * block_size + p % block_size)
            starts.append(starts[-1] + n)
        seq_lens = torch.tensor([c + n for c, n in layout], dtype=torch.int32)
        qsl = torch.tensor(starts, dtype=torch.int32)
        common = CommonAttentionMetadata(
            query_start_loc=qsl.to(device), seq_lens=seq_lens.to(device), block_table=tables.to(device),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device), num_reqs=len(layout),
            num_actual_tokens=total, max_query_len=max(n for _, n in layout),
            max_seq_len=int(seq_lens.max()), block_size=block_size,
            query_start_loc_cpu=qsl, seq_lens_cpu=seq_lens,
        )
        metadata = self.backend.get_builder_cls()(self.backend, device).build(common)
        scale = head_size**-0.5
        impl = self.backend.get_impl_cls()(heads, head_size, scale, kv_heads)
        out = impl.forward(q.to(device), k.to(device), v.to(device), kv_cache, metadata)
        # the reference reads the pages the backend wrote: a wrong slot mapping shows twice
        for t, slot in enumerate(slots):
            assert torch.equal(kv_cache[0].reshape(-1, kv_heads, head_size)[slot].cpu(), k[t]), (
                f"{self.backend.name}: token {t}'s key was not written to slot {slot}"
            )
        ref = reference_paged_attention(q.cpu(), key_cache.cpu(), value_cache.cpu(), tables, seq_lens, qsl, scale)
        return out.reshape(total, heads, head_size).double().cpu(), ref

    def test_matches_the_reference_on_every_layout(self) -> None:
        for name, layout in self.LAYOUTS.items():
            for heads, kv_heads in ((4, 4), (8, 2)):  # multi-head and GQA
                out, ref = self._run(layout, heads, kv_heads, seed=hash((name, heads)) % 1000)
                err = (out - ref).abs().max().item()
                assert err <= self.atol, f"{self.backend.name}: layout {name!r} heads {heads}/{kv_heads}: max error {err:.2e} > {self.atol}"

    def test_a_profiling_run_returns_zeros(self) -> None:
        import torch

        impl = self.backend.get_impl_cls()(4, 64, 0.125, 2)
        q = torch.randn(5, 4, 64, dtype=getattr(torch, self.dtype), device=self.device)
        kv = torch.randn(5, 2, 64, dtype=q.dtype, device=self.device)
        out = impl.forward(q, kv, kv, torch.empty(0, dtype=q.dtype, device=self.device), None)
        assert out.shape[0] == 5 and not out.any(), "with attn_metadata None (a profiling run) forward must return zeros"
