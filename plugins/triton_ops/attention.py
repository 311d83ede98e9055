"""``triton_paged``: paged attention in Triton for mixed prefill / decode batches.

One kernel launch per layer writes the new K/V through the slot mapping
(:func:`reshape_and_cache`), a second attends every query token over its request's pages
(:func:`paged_attention`: varlen prompts, chunks after prefix-cache hits and single decode tokens
in one grid). A batch of decodes only uses the decode kernel instead: one program per (request,
KV head, span) with the KV head's query heads as matmul rows (K/V read once per GQA group), and
split-K over the sequence when the batch alone would not fill the GPU.

The backend runs on CUDA devices (and ROCm, whose torch reports ``cuda`` devices). Under
``TRITON_INTERPRET=1`` it also accepts CPU tensors, which is how the engine-level tests run it
without a GPU.

**fp8 KV pages** (``--kv-cache-dtype fp8``, float8_e4m3fn): the cache write stores
``e4m3(clamp(k / k_scale, +-448))``; the attention kernels widen each page tile to the compute
dtype in registers, fold ``k_scale`` into the softmax scale and multiply the output by
``v_scale`` (one multiply per output row instead of one per element). Triton converts e4m3 with
the GPU's fp8 instructions, which NVIDIA GPUs have from compute capability 8.9 (Ada, Hopper) on;
on older ones ``supports_combination`` refuses fp8 and the platform's next backend,
``torch_paged`` (torch converts in software on any GPU), serves it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from host.sdk.attention import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
    MultipleOf,
)


@dataclass
class TritonAttentionMetadata:
    num_actual_tokens: int
    num_reqs: int
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor  # int32 [num_reqs + 1]
    seq_lens: torch.Tensor  # int32 [num_reqs]
    block_table: torch.Tensor  # int32 [num_reqs, max_blocks]
    slot_mapping: torch.Tensor  # int64 [num_tokens]
    causal: bool = True


class TritonAttentionMetadataBuilder(AttentionMetadataBuilder):
    def build(self, common: CommonAttentionMetadata) -> TritonAttentionMetadata:
        if not common.causal:
            raise ValueError("triton_paged implements causal (decoder) attention only")
        dev = common.query_start_loc.device
        return TritonAttentionMetadata(
            num_actual_tokens=common.num_actual_tokens,
            num_reqs=common.num_reqs,
            max_query_len=common.max_query_len,
            max_seq_len=common.max_seq_len,
            query_start_loc=common.query_start_loc[: common.num_reqs + 1].to(dev, torch.int32),
            seq_lens=common.seq_lens[: common.num_reqs].to(dev, torch.int32),
            block_table=common.block_table[: common.num_reqs].to(dev, torch.int32).contiguous(),
            slot_mapping=common.slot_mapping[: common.num_actual_tokens].to(dev, torch.int64),
        )


FP8_KV_DTYPES = ("fp8", "fp8_e4m3")  # --kv-cache-dtype values meaning float8_e4m3fn pages
FP8_MIN_CAPABILITY = (8, 9)  # NVIDIA GPUs with e4m3 conversion instructions (Ada, Hopper and later)


def _fp8_problem() -> str | None:
    """Why this machine's GPU cannot run the fp8 page conversions, or ``None``: refused below
    compute capability 8.9; not refused when no CUDA device is visible (the platform fails first)
    or under the interpreter (numpy converts)."""
    if os.environ.get("TRITON_INTERPRET", "0") == "1" or not torch.cuda.is_available():
        return None
    if torch.version.hip:  # ROCm's fp8 is e4m3fnuz on gfx942: a different encoding
        return "fp8 KV pages on ROCm are not supported (OCP e4m3fn vs e4m3fnuz differ by GPU)"
    capability = torch.cuda.get_device_capability()
    if capability < FP8_MIN_CAPABILITY:
        return (
            f"fp8 KV pages need compute capability >= {FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]} "
            f"(this GPU has {capability[0]}.{capability[1]}); torch_paged converts them in software"
        )
    return None


class TritonPagedAttentionImpl(AttentionImpl):
    """``k_scale`` / ``v_scale``: this layer's fp8 scales (``value = stored * scale``), used only
    over float8_e4m3fn caches; 1.0 unless set before the first step, fixed afterwards (pages
    already written, prefix-cached ones included, are read with the same scales)."""

    k_scale: float = 1.0
    v_scale: float = 1.0

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: TritonAttentionMetadata | None,
        output: torch.Tensor | None = None,
    ) -> torch.Tensor:
        from host.plugins.triton_ops import kernels as tk

        output, n = self.prepare_output(query, attn_metadata, output)
        if n is None:
            return output
        md = attn_metadata
        k_cache, v_cache = kv_cache[0], kv_cache[1]
        tk.reshape_and_cache(key[:n], value[:n], k_cache, v_cache, md.slot_mapping, self.k_scale, self.v_scale)
        q = query[:n]
        if md.max_query_len == 1:  # decodes only: the GQA-grouped split-K kernel
            tk.paged_decode_split(
                q, k_cache, v_cache, md.block_table, md.seq_lens, self.scale, self.sliding_window,
                max_seq_len=md.max_seq_len, out=output[:n], k_scale=self.k_scale, v_scale=self.v_scale,
            )
        else:
            tk.paged_attention(
                q, k_cache, v_cache, md.block_table, md.query_start_loc, md.seq_lens,
                md.max_query_len, self.scale, self.sliding_window, out=output[:n],
                k_scale=self.k_scale, v_scale=self.v_scale,
            )
        return output


class TritonPagedAttentionBackend(AttentionBackend):
    """Paged attention in Triton: any block size, sliding windows, prefix caching, mixed
    batches, GQA/MQA, float32 / bfloat16 / float16; the KV cache in the model dtype or fp8
    (float8_e4m3fn, compute capability >= 8.9; see the module doc)."""

    name: ClassVar[str] = "triton_paged"
    device_types: ClassVar[tuple[str, ...]] = ("cuda",)
    supported_dtypes: ClassVar[tuple[str, ...]] = ("float32", "bfloat16", "float16")
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("auto", *FP8_KV_DTYPES)
    supported_head_sizes: ClassVar[tuple[int, ...] | None] = None
    block_size_constraint: ClassVar[MultipleOf] = MultipleOf(1)
    supports_sliding_window: ClassVar[bool] = True
    supports_prefix_caching: ClassVar[bool] = True
    supports_mixed_batches: ClassVar[bool] = True
    supports_cuda_graphs: ClassVar[bool] = True

    @classmethod
    def supports_combination(cls, req: Any) -> str | None:
        if req.device_type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") == "1":
            req = type(req)(**{**req.__dict__, "device_type": "cuda"})  # interpreter: CPU tensors
        reason = super().supports_combination(req)
        if reason is None and req.kv_cache_dtype in FP8_KV_DTYPES:
            problem = _fp8_problem()
            if problem:
                return f"{cls.name}: {problem}"
        return reason

    @classmethod
    def get_impl_cls(cls) -> type[AttentionImpl]:
        return TritonPagedAttentionImpl

    @classmethod
    def get_builder_cls(cls) -> type[AttentionMetadataBuilder]:
        return TritonAttentionMetadataBuilder
