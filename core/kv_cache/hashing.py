"""Chained block hashes for prefix caching.

The hash of block ``i`` covers the block's token ids, its extra keys and the hash of block
``i - 1``, so it fingerprints the whole prefix from token 0 to the end of the block: two requests
reuse a KV block only when everything before it is identical too. Only full blocks are hashed.

The hash is sha256 over a fixed byte serialisation, so it is the same in every process and on
every machine (no ``PYTHONHASHSEED`` dependence). ``cache_salt`` goes into the first block only;
through the chain it separates every later block as well. A LoRA request's adapter enters every
block's extra keys as ``("lora", name, digest)``: by name and by content (the sha256 of the
adapter's files), so two adapters never share a block, and an adapter reloaded with changed
weights under the same name never meets the KV its old weights computed.
"""

from __future__ import annotations

import hashlib
import pickle
import struct
from typing import TYPE_CHECKING, Any, Sequence

from host.contracts.request import BlockHash, BlockHasher

if TYPE_CHECKING:
    from host.contracts.lora_request import LoRARequest
    from host.contracts.request import Request

#: The parent hash of a request's first block (a fixed seed: identical across processes).
NONE_HASH: BlockHash = BlockHash(hashlib.sha256(b"host-none-hash").digest())

ExtraKeys = tuple[Any, ...] | None


def hash_block_tokens(
    parent_block_hash: BlockHash | None,
    token_ids: Sequence[int],
    extra_keys: ExtraKeys = None,
) -> BlockHash:
    """Hash one full block: sha256(parent || token ids as little-endian int64 || extra keys).

    ``parent_block_hash=None`` means "first block" and is the same as passing ``NONE_HASH``.
    """
    h = hashlib.sha256(parent_block_hash or NONE_HASH)
    h.update(struct.pack(f"<I{len(token_ids)}q", len(token_ids), *token_ids))
    if extra_keys:
        h.update(b"\x01")
        h.update(pickle.dumps(tuple(extra_keys), protocol=4))
    return BlockHash(h.digest())


def lora_extra_keys(lora_request: "LoRARequest | None") -> tuple[Any, ...]:
    """``("lora", name, digest)`` for a request with an adapter, ``()`` for the base model."""
    if lora_request is None:
        return ()
    return ("lora", lora_request.lora_name, lora_request.digest)


def block_extra_keys(
    start_token_idx: int, cache_salt: str | None = None, lora_request: "LoRARequest | None" = None,
) -> ExtraKeys:
    """The extra keys of the block starting at ``start_token_idx`` (``None`` when there are none).

    Every block of a LoRA request starts with :func:`lora_extra_keys`; the cache salt follows on
    the first block. Multimodal ids join here later, ahead of the salt.
    """
    keys = lora_extra_keys(lora_request)
    if cache_salt is not None and start_token_idx == 0:
        keys += (cache_salt,)
    return keys or None


def hash_token_blocks(
    token_ids: Sequence[int],
    block_size: int,
    cache_salt: str | None = None,
    parent_block_hash: BlockHash | None = None,
    start_token_idx: int = 0,
    lora_request: "LoRARequest | None" = None,
) -> list[BlockHash]:
    """Chained hashes of every full block of ``token_ids[start_token_idx:]``.

    ``start_token_idx`` must be block-aligned and ``parent_block_hash`` the hash of the block
    before it (``None`` at the start). A trailing partial block is not hashed. ``lora_request``:
    the request's adapter (``None``: the base model), see :func:`block_extra_keys`.
    """
    hashes: list[BlockHash] = []
    parent = parent_block_hash
    start = start_token_idx
    n = len(token_ids)
    while start + block_size <= n:
        end = start + block_size
        parent = hash_block_tokens(parent, token_ids[start:end], block_extra_keys(start, cache_salt, lora_request))
        hashes.append(parent)
        start = end
    return hashes


def make_block_hasher(block_size: int) -> BlockHasher:
    """A per-request incremental hasher: called with a request, it returns the hashes of the
    full blocks not yet in ``request.block_hashes`` (starting at ``len(block_hashes) *
    block_size``), keyed by the request's cache salt and adapter; it returns ``[]`` while the
    next block is still partial."""
    if block_size < 1:
        raise ValueError(f"block_size={block_size} must be >= 1")

    def hasher(request: "Request") -> list[BlockHash]:
        done = request.block_hashes
        start = len(done) * block_size
        if start + block_size > request.num_tokens:
            return []
        return hash_token_blocks(
            request.all_token_ids,
            block_size,
            cache_salt=request.cache_salt,
            parent_block_hash=done[-1] if done else None,
            start_token_idx=start,
            lora_request=request.lora_request,
        )

    hasher.block_size = block_size  # type: ignore[attr-defined]
    return hasher
