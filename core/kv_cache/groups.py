"""KV cache groups: which layers share a block table, and how big one block is.

With one group (every model whose layers all use one spec, or the hybrid allocator off) every
layer uses the same block ids and one block holds a page of every layer.

A hybrid layout (layers of different kinds: full attention and sliding windows of various
sizes) splits the layers into **equal-size groups** of ``group_size`` layers, each group of one
kind. The worker allocates ``group_size`` KV tensors of ``num_blocks`` blocks each; layer ``j``
of every group views tensor ``j``, and a block id allocated by group ``g`` is used by all layers
of group ``g``. One :class:`~host.core.kv_cache.block_pool.BlockPool` therefore serves every
group, and one block is ``group_size`` layer pages. A kind whose layer count is not a multiple of
``group_size`` gets a last group with fewer layers (its unused slots are padding: allocated,
never read). A Gemma-3-shaped model (18 layers: 3 full attention, 15 with a 512-token window)
becomes 6 groups of 3 layers: 1 full, 5 sliding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from host.core.kv_cache.spec import FullAttentionSpec, KVCacheSpec, SlidingWindowSpec


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class KVCacheGroup:
    """One KV cache group: the spec its layers share and their global layer indices, in order
    (the layer at position ``j`` views the worker's KV tensor ``j``)."""

    spec: KVCacheSpec
    layers: tuple[int, ...]


@dataclass(frozen=True)
class KVCacheLayout:
    """The groups of a KV cache and the size of one block.

    ``group_size``: layer pages per block (the KV tensors the worker allocates). With a single
    group it is the number of layers (today's flat layout: one page of every layer per block).
    ``page_size_bytes``: bytes of one block (``group_size`` layer pages; with one group the sum
    of every layer's page).
    """

    groups: tuple[KVCacheGroup, ...]
    group_size: int
    page_size_bytes: int

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def is_hybrid(self) -> bool:
        """Several groups: the worker keeps one block table per group."""
        return len(self.groups) > 1

    @property
    def frees_windows(self) -> bool:
        """Some group is a sliding window that frees what it has left (the hybrid manager runs
        it; also for one group, when every layer has the same window)."""
        return any(isinstance(g.spec, SlidingWindowSpec) for g in self.groups)

    def blocks_per_request(self, num_tokens: int) -> int:
        """The fewest blocks a request of ``num_tokens`` tokens holds at its end, over all groups
        (a sliding-window group keeps its window's blocks plus one)."""
        return sum(group_blocks_per_request(g.spec, num_tokens) for g in self.groups)

    def group_of_layer(self) -> dict[int, tuple[int, int]]:
        """Global layer index -> (group id, position in the group)."""
        return {layer: (gid, j) for gid, g in enumerate(self.groups) for j, layer in enumerate(g.layers)}


def group_blocks_per_request(spec: KVCacheSpec, num_tokens: int) -> int:
    """Blocks one request of ``num_tokens`` tokens holds in a group of ``spec`` once its window
    (if any) has slid: every block for full attention, the window's blocks plus one for a
    sliding window."""
    full = _cdiv(num_tokens, spec.block_size)
    if isinstance(spec, SlidingWindowSpec):
        return min(full, _cdiv(spec.sliding_window - 1, spec.block_size) + 1)
    return full


def kind_of(spec: KVCacheSpec) -> tuple:
    """The grouping key of a layer spec: layers of one kind may share a group."""
    return (type(spec), getattr(spec, "sliding_window", None))


def single_group_layout(specs: Sequence[KVCacheSpec], layers: Sequence[int]) -> KVCacheLayout:
    """Every layer in one group (sliding-window layers allocated like full attention: the seed's
    conservative policy). The group's spec is the first full-attention layer's, else the first."""
    specs = list(specs)
    if not specs:
        raise ValueError("cannot lay out a KV cache without layer specs")
    spec = next((s for s in specs if not isinstance(s, SlidingWindowSpec)), specs[0])
    if isinstance(spec, SlidingWindowSpec):  # all sliding: one group, allocated for every token
        spec = FullAttentionSpec(spec.block_size, spec.num_kv_heads, spec.head_size, spec.dtype)
    return KVCacheLayout((KVCacheGroup(spec, tuple(layers)),), len(specs), sum(s.page_size_bytes for s in specs))


def hybrid_blocker(specs: Sequence[KVCacheSpec]) -> str | None:
    """Why ``specs`` cannot be laid out as hybrid groups (``None``: they can, and it pays off)."""
    kinds = {kind_of(s) for s in specs}
    if len(kinds) < 2 and not isinstance(specs[0], SlidingWindowSpec):
        return "every layer is full attention"
    pages = {s.page_size_bytes for s in specs}
    if len(pages) > 1:
        return f"layers have different page sizes ({sorted(pages)} bytes): equal-size groups need one"
    sizes = {s.block_size for s in specs}
    if len(sizes) > 1:
        return f"layers have different block sizes {sorted(sizes)}"
    return None


def plan_kv_cache_layout(specs: Sequence[KVCacheSpec], layers: Sequence[int] | None = None,
                         hybrid: bool = True) -> KVCacheLayout:
    """Group the layers ``layers`` (global indices; ``range(len(specs))`` by default) whose
    specs are ``specs``.

    With ``hybrid`` and more than one kind of layer of one page size, layers are grouped by kind
    (full attention first, then sliding windows by increasing size) into groups of
    ``group_size`` layers, the layer count of the rarest kind (layers all of one window: one
    sliding-window group of every layer); otherwise one group allocated like full attention."""
    specs = list(specs)
    layers = list(range(len(specs))) if layers is None else list(layers)
    if len(layers) != len(specs):
        raise ValueError(f"{len(layers)} layer indices for {len(specs)} layer specs")
    if not hybrid or hybrid_blocker(specs) is not None:
        return single_group_layout(specs, layers)
    by_kind: dict[tuple, list[int]] = {}
    spec_of_kind: dict[tuple, KVCacheSpec] = {}
    for spec, layer in zip(specs, layers):
        key = kind_of(spec)
        by_kind.setdefault(key, []).append(layer)
        spec_of_kind.setdefault(key, spec)
    group_size = min(len(v) for v in by_kind.values())

    def order(key: tuple) -> tuple:
        return (key[1] is not None, key[1] or 0, key[0].__name__)

    groups: list[KVCacheGroup] = []
    for key in sorted(by_kind, key=order):
        members = by_kind[key]
        for start in range(0, len(members), group_size):
            groups.append(KVCacheGroup(spec_of_kind[key], tuple(members[start : start + group_size])))
    return KVCacheLayout(tuple(groups), group_size, group_size * specs[0].page_size_bytes)
