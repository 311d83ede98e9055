"""What one layer's KV cache looks like, and how many blocks a memory budget buys.

Specs are frozen dataclasses: the scheduler, the KV cache manager and the workers all read the
same immutable description. A registry maps each spec class to the KV cache manager class that
handles it; lookups walk the MRO, so a subclass of a registered spec inherits its manager.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

_DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
}


def dtype_num_bytes(dtype: str) -> int:
    """Bytes per element of a dtype name (``"bfloat16"``, ``"torch.float16"``, ``"fp8"``...)."""
    name = str(dtype).removeprefix("torch.")
    try:
        return _DTYPE_BYTES[name]
    except KeyError:
        raise ValueError(
            f"KV cache dtype {dtype!r} is not supported; use one of {', '.join(sorted(_DTYPE_BYTES))}"
        ) from None


FP8_KV_DTYPE = "float8_e4m3fn"
"""The element type of ``--kv-cache-dtype fp8`` pages (OCP e4m3: 4 exponent bits, 3 mantissa bits,
finite range +-448, no infinities)."""
FP8_E4M3_MAX = 448.0
"""The largest finite float8_e4m3fn value; K/V are clamped to +-448 * scale before the cast."""


def kv_cache_element_dtype(cache_dtype: str, model_dtype: str) -> str:
    """The dtype name KV pages are stored in: the model dtype for ``auto``, ``float8_e4m3fn`` for
    ``fp8`` / ``fp8_e4m3`` (``--kv-cache-dtype``). Page sizes and the worker's cache tensors both
    follow it, so an fp8 cache holds twice the blocks of a bfloat16 one in the same budget."""
    if cache_dtype == "auto":
        return str(model_dtype).removeprefix("torch.")
    if cache_dtype in ("fp8", "fp8_e4m3"):
        return FP8_KV_DTYPE
    raise ValueError(f"kv cache dtype {cache_dtype!r} is not supported; use one of auto, fp8, fp8_e4m3")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class KVCacheSpec:
    """Base of all KV cache layouts: one block holds ``block_size`` tokens of one layer."""

    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: str

    def __post_init__(self) -> None:
        for name in ("block_size", "num_kv_heads", "head_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{type(self).__name__}.{name}={value!r} must be an integer >= 1")
        dtype_num_bytes(self.dtype)  # validates the name

    @property
    def dtype_bytes(self) -> int:
        return dtype_num_bytes(self.dtype)

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one block of one layer: K and V for ``block_size`` tokens."""
        return 2 * self.block_size * self.num_kv_heads * self.head_size * self.dtype_bytes

    def max_memory_usage_bytes(self, max_model_len: int) -> int:
        """Bytes one request of ``max_model_len`` tokens needs in this layer."""
        return _cdiv(max_model_len, self.block_size) * self.page_size_bytes


@dataclass(frozen=True)
class AttentionSpec(KVCacheSpec):
    """KV of a softmax-attention layer (K and V per token per KV head)."""


@dataclass(frozen=True)
class FullAttentionSpec(AttentionSpec):
    """Causal attention over the whole sequence: one block per ``block_size`` tokens."""


@dataclass(frozen=True)
class SlidingWindowSpec(AttentionSpec):
    """Attention over the last ``sliding_window`` tokens.

    With a single KV cache group (``--disable-hybrid-kv-cache-manager``, or where hybrid groups
    are not supported) the manager allocates sliding-window layers like full attention
    (conservative allocation, exact windowed computation), so the memory need is the full one.
    In a hybrid layout a sliding-window group keeps only the blocks its window can still read
    (:mod:`host.core.kv_cache.sliding_window_group`).
    """

    sliding_window: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.sliding_window, int) or self.sliding_window < 1:
            raise ValueError(f"SlidingWindowSpec.sliding_window={self.sliding_window!r} must be >= 1")


# -- sizing ------------------------------------------------------------------------------------


@dataclass
class KVCacheConfig:
    """The KV cache the engine allocates: ``num_blocks`` blocks of ``block_size`` tokens, each
    block holding one page of every layer in ``kv_cache_specs`` (in layer order), or with a
    hybrid ``layout`` (:mod:`host.core.kv_cache.groups`) one page of ``layout.group_size``
    layers (the block belongs to one group). ``layer_names`` optionally names the layers (same
    order)."""

    num_blocks: int
    block_size: int
    kv_cache_specs: list[KVCacheSpec] = field(default_factory=list)
    layer_names: list[str] = field(default_factory=list)
    layout: Any = None  # a host.core.kv_cache.groups.KVCacheLayout (None: one group)

    def __post_init__(self) -> None:
        if self.num_blocks < 2:
            raise ValueError(
                f"num_blocks={self.num_blocks} must be >= 2 (block 0 is reserved as the null block)"
            )
        if self.block_size < 1:
            raise ValueError(f"block_size={self.block_size} must be >= 1")
        for spec in self.kv_cache_specs:
            if spec.block_size != self.block_size:
                raise ValueError(
                    f"layer spec block_size={spec.block_size} differs from KVCacheConfig.block_size="
                    f"{self.block_size}"
                )
        if self.layer_names and len(self.layer_names) != len(self.kv_cache_specs):
            raise ValueError(
                f"{len(self.layer_names)} layer_names for {len(self.kv_cache_specs)} kv_cache_specs"
            )

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one block: every layer's page, or the hybrid layout's group of pages."""
        if self.layout is not None:
            return self.layout.page_size_bytes
        return sum(s.page_size_bytes for s in self.kv_cache_specs)

    @property
    def kv_cache_bytes(self) -> int:
        """Total bytes of the KV cache (all blocks, all layers; the null block included)."""
        return self.num_blocks * self.page_size_bytes


def num_blocks_from_memory(
    budget_bytes: int, specs: Sequence[KVCacheSpec], max_model_len: int | None = None,
    layout: Any = None,
) -> int:
    """How many blocks ``budget_bytes`` holds, where one block stores a page of every layer (or,
    with a hybrid ``layout``, a :class:`host.core.kv_cache.groups.KVCacheLayout`,
    ``layout.group_size`` pages).

    The count includes the reserved null block. With ``max_model_len`` given, raises
    ``ValueError`` when the budget cannot hold even one request of that length (in a hybrid
    layout: its full-attention blocks plus its windows' blocks).
    """
    specs = list(specs)
    if not specs:
        raise ValueError("cannot size a KV cache without layer specs")
    per_block = layout.page_size_bytes if layout is not None else sum(s.page_size_bytes for s in specs)
    num_blocks = max(int(budget_bytes) // per_block, 0)
    block_size = specs[0].block_size
    # one max_model_len request plus the null block
    if not max_model_len:
        needed = 2
    elif layout is not None:
        needed = layout.blocks_per_request(max_model_len) + 1
    else:
        needed = _cdiv(max_model_len, block_size) + 1
    if num_blocks < needed:
        need_bytes = needed * per_block
        what = f"one request of max_model_len={max_model_len}" if max_model_len else "one block"
        raise ValueError(
            f"the KV cache budget of {budget_bytes} bytes ({budget_bytes / 2**30:.3f} GiB) holds "
            f"{num_blocks} blocks of {block_size} tokens ({per_block} bytes each across "
            f"{len(specs)} layers), but {what} needs {needed} blocks ({need_bytes} bytes, "
            f"{need_bytes / 2**30:.3f} GiB); raise --kv-cache-memory (or --gpu-memory-utilization)"
            f" or lower --max-model-len"
        )
    return num_blocks

