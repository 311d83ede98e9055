"""``triton_rocm``: the shared Triton paged attention (``triton_paged``), advertised with what it
can honestly claim on AMD GPUs.

The class is a subclass of :class:`~host.plugins.triton_ops.attention.TritonPagedAttentionBackend`
with nothing but capability flags of its own: the impl, the metadata builder and every kernel are
the ones the CUDA platform runs (:mod:`host.plugins.triton_ops`), which Triton compiles for AMD
GPUs as well. A separate
name (rather than a ROCm branch inside ``triton_paged``) keeps the flags in the backend's "job
advert", where the attention selector reads them and reports a mismatch at start-up.

What differs from ``triton_paged``:

- **block size: a multiple of 16.** The kernel is correct for any page size, but with pages
  of a multiple of 16 tokens each key tile of the attention kernel covers whole pages
  (``min(64, block_size)`` keys), and 16 is the edge of the MFMA / WMMA matrix tiles the
  ``tl.dot`` calls map onto. 16 is the ROCm platform's block size.
- **head size at most 256 (16-bit) / 128 (float32).** One attention program holds a query tile
  (16 rows) and a key tile (up to 64 rows; 32 in the decode kernel) of ``head_size`` padded to a
  power of two; Triton stages ``tl.dot`` operands through LDS, which is 64 KiB per workgroup
  on CDNA2/CDNA3 and RDNA. ``(16 + 64) * 256 * 2`` bytes fits; float32 at 256 (80 KiB) would
  fail to compile at the first request, so it is refused here instead. This is an estimate from the tile shapes,
  not a measurement: no AMD GPU has run these kernels yet (docs/rocm.md).
- **KV cache in the model dtype only**: host's fp8 KV cache stores OCP e4m3fn pages, while ROCm's
  fp8 comes in two encodings (e4m3fnuz on gfx942, OCP e4m3fn on gfx950), which a backend would
  have to declare separately.
"""

from __future__ import annotations

from typing import Any, ClassVar

from host.plugins.triton_ops.attention import TritonPagedAttentionBackend
from host.sdk.attention import MultipleOf

LDS_BYTES = 64 * 1024


class RocmTritonAttentionBackend(TritonPagedAttentionBackend):
    """The shared Triton paged attention under ROCm's capability flags (see the module doc)."""

    name: ClassVar[str] = "triton_rocm"
    device_types: ClassVar[tuple[str, ...]] = ("cuda",)  # a HIP build of torch names its devices "cuda"
    supported_dtypes: ClassVar[tuple[str, ...]] = ("float32", "bfloat16", "float16")
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("auto",)
    block_size_constraint: ClassVar[MultipleOf] = MultipleOf(16)
    supports_sliding_window: ClassVar[bool] = True
    supports_prefix_caching: ClassVar[bool] = True
    supports_mixed_batches: ClassVar[bool] = True
    # largest head size per model dtype whose query + key tiles fit the LDS budget
    max_head_size: ClassVar[dict[str, int]] = {"float16": 256, "bfloat16": 256, "float32": 128}

    @classmethod
    def supports_combination(cls, req: Any) -> str | None:
        reason = super().supports_combination(req)
        if reason:
            return reason
        limit = cls.max_head_size.get(req.dtype)
        if limit is not None and req.head_size > limit:
            return (
                f"{cls.name}: head size {req.head_size} in {req.dtype} exceeds {limit}: its query and key "
                f"tiles would not fit the {LDS_BYTES // 1024} KiB LDS of an AMD workgroup"
            )
        return None

    @classmethod
    def describe(cls) -> dict[str, Any]:
        info = super().describe()
        info["max_head_size"] = dict(cls.max_head_size)
        info["kernels"] = "host.plugins.triton_ops.kernels (shared with triton_paged)"
        return info
