"""Attention backend base classes: a paged-attention kernel behind a stable interface.

A backend is a "job advert": it declares what it can run (device types, dtypes, head sizes,
block sizes, sliding window). The platform picks the first one that fits; a mismatch is reported
at start-up as a reason string, never discovered as a crash mid-request.

The model layer only ever holds an :class:`AttentionImpl` and calls ``forward``; the backend maps
``block_table``, ``slot_mapping`` and ``seq_lens`` onto its kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class MultipleOf:
    """A block-size constraint: any positive multiple of ``base``."""

    base: int

    def accepts(self, block_size: int) -> bool:
        return block_size > 0 and block_size % self.base == 0

    def __str__(self) -> str:
        return f"a multiple of {self.base}"


@dataclass(frozen=True)
class AttentionRequirements:
    """What a model needs from an attention backend; matched against each backend's flags."""

    device_type: str
    dtype: str
    head_size: int
    block_size: int
    kv_cache_dtype: str = "auto"
    sliding_window: int | None = None
    # tanh soft-capping of the attention logits (Gemma 2: ``cap * tanh(logit / cap)``), None = off
    logits_soft_cap: float | None = None
    # learned per-head sink logits joining the softmax denominator (gpt-oss), False = none
    sinks: bool = False


@dataclass
class CommonAttentionMetadata:
    """Per-step batch layout shared by every backend (tensors live on the model's device).

    For request ``i``: its new tokens are ``query_start_loc[i]:query_start_loc[i+1]`` of the
    flattened batch, its whole sequence (cached context plus new tokens) is ``seq_lens[i]`` long,
    and its KV pages are ``block_table[i]``. ``slot_mapping[t]`` is where token ``t``'s K/V is
    written (``block_id * block_size + offset``; ``-1`` means do not write).
    """

    query_start_loc: "torch.Tensor"  # int32 [num_reqs + 1]
    seq_lens: "torch.Tensor"  # int32 [num_reqs]
    block_table: "torch.Tensor"  # int32 [num_reqs, max_blocks_per_req]
    slot_mapping: "torch.Tensor"  # int64 [num_tokens]
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    block_size: int
    causal: bool = True
    # host-side copies, so metadata builders need no device->host sync
    query_start_loc_cpu: "torch.Tensor | None" = None
    seq_lens_cpu: "torch.Tensor | None" = None


class AttentionImpl:
    """One attention layer's kernel state; built once per layer by the model.

    ``logits_soft_cap`` (``None``: off) asks for tanh soft-capping of the scaled attention logits
    before the mask and the softmax: ``cap * tanh(scale * q.k / cap)`` (Gemma 2). An impl that
    cannot compute it keeps ``supports_logits_soft_cap = False``, and this constructor then
    refuses the layer with a ``ValueError`` (its backend also declares the capability, so the
    platform's selection skips it for such a model).

    ``sinks`` (``None``: none) is a float tensor ``[num_heads]`` of learned per-head sink logits
    (gpt-oss): each head's softmax denominator gains ``exp(sink)``, a logit with no value, so
    ``out = sum_i exp(s_i) v_i / (exp(sink) + sum_i exp(s_i))``. It is the layer's parameter,
    filled at load: the impl keeps the tensor and reads it at every call. An impl that cannot
    add sinks keeps ``supports_sinks = False`` and this constructor refuses the layer (its
    backend's ``supports_sinks`` keeps it out of selection for such a model)."""

    supports_logits_soft_cap: bool = False
    supports_sinks: bool = False

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        sliding_window: int | None = None,
        kv_cache_dtype: str = "auto",
        logits_soft_cap: float | None = None,
        sinks: "torch.Tensor | None" = None,
    ) -> None:
        if sinks is not None:
            if not self.supports_sinks:
                raise ValueError(
                    f"{type(self).__qualname__} cannot add attention sinks (the layer has learned sink logits, "
                    "as gpt-oss does); pick a backend that can (--attention-backend torch_paged, or cpu_paged on CPU)"
                )
            if tuple(sinks.shape) != (num_heads,):
                raise ValueError(f"sinks has shape {tuple(sinks.shape)}; one sink logit per query head, ({num_heads},), is needed")
        if logits_soft_cap is not None:
            if not self.supports_logits_soft_cap:
                raise ValueError(
                    f"{type(self).__qualname__} cannot soft-cap attention logits (logits_soft_cap={logits_soft_cap}); "
                    "pick a backend that can (--attention-backend torch_paged, or cpu_paged on CPU)"
                )
            if not logits_soft_cap > 0:
                raise ValueError(f"logits_soft_cap={logits_soft_cap!r} must be a positive number (or None for off)")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.sliding_window = sliding_window
        self.kv_cache_dtype = kv_cache_dtype
        self.logits_soft_cap = None if logits_soft_cap is None else float(logits_soft_cap)
        self.sinks = sinks

    def forward(
        self,
        query: "torch.Tensor",
        key: "torch.Tensor",
        value: "torch.Tensor",
        kv_cache: "torch.Tensor",
        attn_metadata: Any,
        output: "torch.Tensor | None" = None,
    ) -> "torch.Tensor":
        """Write this step's ``key``/``value`` into ``kv_cache`` through the slot mapping, then
        attend every query token over its request's pages.

        ``query`` is ``[num_tokens, num_heads, head_size]``; ``key``/``value`` are
        ``[num_tokens, num_kv_heads, head_size]``. With ``attn_metadata is None`` (a profiling
        run) the output is zeros. Returns ``[num_tokens, num_heads, head_size]``.
        """
        raise NotImplementedError

    def prepare_output(
        self, query: "torch.Tensor", attn_metadata: Any, output: "torch.Tensor | None"
    ) -> tuple["torch.Tensor", int | None]:
        """The common prologue of ``forward``: the output buffer (allocated like ``query`` when
        not given) and the number of real tokens, with rows past them (padding) zeroed. For a
        profiling run (``attn_metadata is None``) the whole output is zeroed and ``None`` is
        returned as the count: nothing else to do."""
        import torch

        if output is None:
            output = torch.empty(query.shape[0], self.num_heads, self.head_size, dtype=query.dtype, device=query.device)
        if attn_metadata is None:
            return output.zero_(), None
        n = attn_metadata.num_actual_tokens
        if query.shape[0] > n:
            output[n:].zero_()
        return output, n


class AttentionMetadataBuilder:
    """Turns :class:`CommonAttentionMetadata` into the backend's own metadata object."""

    def __init__(self, backend: "type[AttentionBackend]", device: Any) -> None:
        self.backend = backend
        self.device = device

    def build(self, common: CommonAttentionMetadata) -> Any:
        return common


class AttentionBackend:
    """Declares one paged-attention implementation and its capabilities.

    Subclasses set the class fields and return their impl and builder classes. ``name`` is the
    key that ``--attention-backend`` and platform priority lists use.
    """

    name: ClassVar[str] = ""
    device_types: ClassVar[tuple[str, ...]] = ()
    supported_dtypes: ClassVar[tuple[str, ...]] = ("float32", "bfloat16", "float16")
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("auto",)
    supported_head_sizes: ClassVar[tuple[int, ...] | None] = None  # None means any
    block_size_constraint: ClassVar[MultipleOf] = MultipleOf(16)
    supports_sliding_window: ClassVar[bool] = False
    # tanh soft-capping of attention logits (its impl's ``supports_logits_soft_cap``)
    supports_logits_soft_cap: ClassVar[bool] = False
    # learned per-head attention sinks (its impl's ``supports_sinks``)
    supports_sinks: ClassVar[bool] = False
    supports_prefix_caching: ClassVar[bool] = True
    supports_mixed_batches: ClassVar[bool] = True  # prefill and decode in one varlen batch
    # can run inside a device graph: the metadata builder keeps views of the buffers it is given
    # and reads nothing from the host, and the kernels' launch parameters depend only on shapes
    # and on ``max_seq_len`` (an upper bound during capture)
    supports_cuda_graphs: ClassVar[bool] = False

    @classmethod
    def supports_combination(cls, req: AttentionRequirements) -> str | None:
        """``None`` when this backend can serve ``req``, else the reason it cannot."""
        if cls.device_types and req.device_type not in cls.device_types:
            return f"{cls.name}: device type {req.device_type!r} not in {list(cls.device_types)}"
        if req.dtype not in cls.supported_dtypes:
            return f"{cls.name}: dtype {req.dtype!r} not in {list(cls.supported_dtypes)}"
        if req.kv_cache_dtype not in cls.supported_kv_cache_dtypes:
            return (
                f"{cls.name}: kv cache dtype {req.kv_cache_dtype!r} not in "
                f"{list(cls.supported_kv_cache_dtypes)}"
            )
        if cls.supported_head_sizes is not None and req.head_size not in cls.supported_head_sizes:
            return f"{cls.name}: head size {req.head_size} not in {list(cls.supported_head_sizes)}"
        if not cls.block_size_constraint.accepts(req.block_size):
            return (
                f"{cls.name}: block size {req.block_size} is not "
                f"{cls.block_size_constraint}"
            )
        if req.sliding_window is not None and not cls.supports_sliding_window:
            return f"{cls.name}: sliding window attention is not supported"
        if req.logits_soft_cap is not None and not cls.supports_logits_soft_cap:
            return f"{cls.name}: attention logit soft-capping is not supported"
        if req.sinks and not cls.supports_sinks:
            return f"{cls.name}: attention sinks are not supported"
        return None

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int, block_size: int, num_kv_heads: int, head_size: int
    ) -> tuple[int, ...]:
        """The shape of one layer's KV cache tensor."""
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    @classmethod
    def get_impl_cls(cls) -> type[AttentionImpl]:
        raise NotImplementedError(f"backend {cls.name!r} does not provide an impl class")

    @classmethod
    def get_builder_cls(cls) -> type[AttentionMetadataBuilder]:
        return AttentionMetadataBuilder

    @classmethod
    def describe(cls) -> dict[str, Any]:
        return {
            "name": cls.name,
            "device_types": list(cls.device_types),
            "dtypes": list(cls.supported_dtypes),
            "block_size": str(cls.block_size_constraint),
            "sliding_window": cls.supports_sliding_window,
            "logits_soft_cap": cls.supports_logits_soft_cap,
            "sinks": cls.supports_sinks,
            "prefix_caching": cls.supports_prefix_caching,
            "mixed_batches": cls.supports_mixed_batches,
            "cuda_graphs": cls.supports_cuda_graphs,
        }
