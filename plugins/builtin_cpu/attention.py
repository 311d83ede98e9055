"""``cpu_paged``: the CPU platform's paged attention — the ``torch_paged`` algorithm
(:mod:`host.plugins.torch_paged.attention`) with decode groups handed to the compiled
``paged_decode`` kernel (:mod:`host.plugins.builtin_cpu.kernels`).

The compiled kernel reads K/V straight from the cache pages through the block table, so a
group of single-token queries skips the gather into a padded workspace. It takes float32 CPU
caches of causal decode groups; every other group, and every group when the kernel could not be
built, runs the torch path — so do all groups over fp8 pages (``--kv-cache-dtype fp8``: the
torch path writes ``e4m3(k / k_scale)`` and reads ``page * k_scale``).

Subclassing the ``torch_paged`` classes is one of the two places a built-in plugin imports
another built-in plugin (an exception ``tests/test_layering.py`` names, like ``RocmPlatform``
subclassing ``CudaPlatform``): ``cpu_paged`` is ``torch_paged`` plus a kernel, not a copy of it.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from host.plugins.builtin_cpu.kernels import paged_decode_kernel
from host.plugins.torch_paged.attention import TorchPagedAttentionBackend, TorchPagedAttentionImpl
from host.plugins.torch_paged.metadata import PagedAttentionGroup, TorchPagedAttentionMetadata
from host.sdk.attention import AttentionImpl


class CpuPagedAttentionImpl(TorchPagedAttentionImpl):
    """The torch algorithm, with single-token causal groups over a float32 CPU cache run by the
    compiled decode kernel (``_decode_kernel``; ``None`` when it could not be built)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # built (or found in the build cache) once per process, at model construction
        self._decode_kernel = paged_decode_kernel()

    def _attend(
        self,
        g: PagedAttentionGroup,
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        md: TorchPagedAttentionMetadata,
        output: torch.Tensor,
    ) -> None:
        if g.max_query_len == 1 and g.causal and self._decode_kernel is not None and kv_cache.dtype == torch.float32 and kv_cache.device.type == "cpu":
            self._attend_decode_kernel(g, query, kv_cache, md, output)
            return
        super()._attend(g, query, kv_cache, md, output)

    def _attend_decode_kernel(
        self,
        g: PagedAttentionGroup,
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        md: TorchPagedAttentionMetadata,
        output: torch.Tensor,
    ) -> None:
        """Single-token queries: the compiled kernel reads the pages in place (no gather)."""
        if g.query_token_range is not None:
            q = query[g.query_token_range[0] : g.query_token_range[1]]
        else:
            q = query.index_select(0, g.query_token_index)
        q = q.reshape(g.num_reqs, self.num_heads, self.head_size).contiguous()
        tables, lens = g.decode_tables(md)
        sinks = None if self.sinks is None else self.sinks.detach().float().contiguous()
        out = self._decode_kernel(q, kv_cache[0], kv_cache[1], tables, lens, self.scale, self.sliding_window or 0,
                                   self.logits_soft_cap or 0.0, sinks)
        if g.query_token_range is not None:
            output[g.query_token_range[0] : g.query_token_range[1]].copy_(out)
        else:
            output.index_copy_(0, g.output_token_index, out)


class CpuPagedAttentionBackend(TorchPagedAttentionBackend):
    """Paged attention for the CPU platform: ``torch_paged`` plus the compiled decode kernel.

    Any positive block size works (``MultipleOf(1)``; 16 is the engine default). Supports
    sliding windows, attention logit soft-capping and attention sinks (the compiled decode kernel
    and the torch path both compute them), prefix caching (context already in the cache) and mixed prefill/decode
    batches. The per-layer cache is ``(2, num_blocks, block_size, num_kv_heads, head_size)``;
    the metadata builder is ``torch_paged``'s. fp8 KV pages (``--kv-cache-dtype fp8``) are
    inherited from ``torch_paged`` (its torch path; the compiled kernel reads float32 only).
    """

    name: ClassVar[str] = "cpu_paged"
    device_types: ClassVar[tuple[str, ...]] = ("cpu",)
    supported_dtypes: ClassVar[tuple[str, ...]] = ("float32", "bfloat16")

    @classmethod
    def get_impl_cls(cls) -> type[AttentionImpl]:
        return CpuPagedAttentionImpl
