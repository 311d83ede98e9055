"""Block pool, free queue and chained block hashes (pure Python, no model)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from host.contracts.request import Request
from host.core.kv_cache.block_pool import BlockPool, FreeBlockQueue, KVCacheBlock
from host.core.kv_cache.hashing import (
    NONE_HASH,
    block_extra_keys,
    hash_block_tokens,
    hash_token_blocks,
    make_block_hasher,
)


def ids(blocks):
    return [b.block_id for b in blocks]


# -- free queue ------------------------------------------------------------------------------


def test_free_queue_order_and_o1_removal():
    blocks = [KVCacheBlock(i) for i in range(6)]
    q = FreeBlockQueue(blocks)
    assert len(q) == 6 and ids(q.get_all_free_blocks()) == [0, 1, 2, 3, 4, 5]

    q.remove(blocks[3])  # from the middle: neighbours are relinked
    assert ids(q.get_all_free_blocks()) == [0, 1, 2, 4, 5]
    assert blocks[2].next_free is blocks[4] and blocks[4].prev_free is blocks[2]
    assert blocks[3].prev_free is None and blocks[3].next_free is None
    with pytest.raises(ValueError):
        q.remove(blocks[3])  # not in the queue any more

    assert q.popleft() is blocks[0]
    q.append(blocks[3])
    q.appendleft(blocks[0])
    assert ids(q.get_all_free_blocks()) == [0, 1, 2, 4, 5, 3]
    assert ids(q.popleft_n(3)) == [0, 1, 2]
    assert len(q) == 3
    with pytest.raises(ValueError):
        q.popleft_n(4)
    q.popleft_n(3)
    with pytest.raises(ValueError):
        q.popleft()


def test_free_queue_removal_is_constant_time():
    # removing the middle of a long queue must not walk it
    import time

    n = 200_000
    blocks = [KVCacheBlock(i) for i in range(n)]
    q = FreeBlockQueue(blocks)
    t0 = time.perf_counter()
    for b in blocks[n // 2 : n // 2 + 1000]:
        q.remove(b)
    assert time.perf_counter() - t0 < 0.05
    assert len(q) == n - 1000


# -- block pool --------------------------------------------------------------------------------


def test_null_block_is_never_allocated():
    pool = BlockPool(5, enable_caching=True)
    assert pool.null_block.block_id == 0 and pool.null_block.is_null
    assert pool.get_num_free_blocks() == 4
    blocks = pool.get_new_blocks(4)
    assert ids(blocks) == [1, 2, 3, 4]
    assert all(b.ref_cnt == 1 for b in blocks)
    assert pool.get_usage() == 1.0
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)
    pool.free_blocks(reversed(blocks))
    assert pool.get_num_free_blocks() == 4 and pool.get_usage() == 0.0
    assert pool.null_block.ref_cnt == 0
    with pytest.raises(ValueError, match="double free"):
        pool.free_blocks([blocks[0]])


def _cache(pool, blocks, tokens_per_block):
    hashes = hash_token_blocks(tokens_per_block, 2)
    pool.cache_full_blocks(blocks, hashes, 0, len(blocks))
    return hashes


def test_free_puts_hashed_blocks_at_the_back_and_unhashed_at_the_front():
    pool = BlockPool(8)
    a = pool.get_new_blocks(3)  # 1, 2, 3
    hashes = _cache(pool, a, [1, 2, 3, 4, 5, 6])
    b = pool.get_new_blocks(2)  # 4, 5: never hashed
    # free a request's blocks in reverse order: its tail is evicted first
    pool.free_blocks(reversed(a))
    pool.free_blocks(reversed(b))
    # unhashed (4, 5) first, then the untouched 6, 7, then the hashed ones tail-first
    assert ids(pool.free_block_queue.get_all_free_blocks()) == [4, 5, 6, 7, 3, 2, 1]
    # all hashed blocks are still findable while free
    assert [pool.get_cached_block(h).block_id for h in hashes] == [1, 2, 3]


def test_eviction_is_lru_and_forgets_the_hash():
    pool = BlockPool(4)  # 3 usable
    a = pool.get_new_blocks(3)
    hashes = _cache(pool, a, list(range(6)))
    pool.free_blocks(reversed(a))  # queue: 3, 2, 1
    reused = pool.get_new_blocks(1)
    assert ids(reused) == [3]  # the chain's tail goes first
    assert reused[0].block_hash is None
    assert pool.get_cached_block(hashes[2]) is None
    assert pool.get_cached_block(hashes[0]).block_id == 1
    assert pool.get_cached_block(hashes[1]).block_id == 2
    pool.free_blocks(reused)
    pool.get_new_blocks(3)
    assert all(pool.get_cached_block(h) is None for h in hashes)
    assert pool.num_cached_blocks() == 0


def test_touch_revives_a_free_cached_block():
    pool = BlockPool(5)
    a = pool.get_new_blocks(2)
    hashes = _cache(pool, a, [7, 7, 8, 8])
    pool.free_blocks(reversed(a))
    hit = pool.get_cached_block(hashes[0])
    pool.touch([hit])
    assert hit.ref_cnt == 1
    assert hit not in pool.free_block_queue.get_all_free_blocks()
    # the revived block can't be handed out any more
    rest = pool.get_new_blocks(pool.get_num_free_blocks())
    assert hit not in rest and pool.get_cached_block(hashes[0]) is hit
    # touching a block in use only adds a reference
    pool.touch([hit])
    assert hit.ref_cnt == 2
    pool.free_blocks([hit, hit])
    pool.free_blocks(rest)
    assert pool.get_num_free_blocks() == 4


def test_duplicate_hash_is_promoted_to_a_dict_and_demoted_on_eviction():
    pool = BlockPool(4)
    h = hash_block_tokens(None, [1, 2])
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks([a], [h], 0, 1)
    pool.cache_full_blocks([b], [h], 0, 1)
    assert pool.num_cached_blocks() == 2
    assert pool.get_cached_block(h) in (a, b)
    pool.free_blocks([a])
    pool.get_new_blocks(2)  # block 3, then a (evicted)
    assert a.block_hash is None
    assert pool.get_cached_block(h) is b and pool.num_cached_blocks() == 1


def test_cache_full_blocks_skips_blocks_that_already_have_a_hash():
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(2)
    hashes = hash_token_blocks([1, 2, 3, 4], 2)
    pool.cache_full_blocks(blocks, hashes, 0, 1)
    pool.cache_full_blocks(blocks, hashes, 0, 2)  # block 0 already hashed: untouched
    assert [b.block_hash for b in blocks] == hashes
    with pytest.raises(ValueError):
        pool.cache_full_blocks(blocks, hashes[:1], 1, 2)


def test_caching_disabled_records_nothing():
    pool = BlockPool(4, enable_caching=False)
    blocks = pool.get_new_blocks(2)
    hashes = hash_token_blocks([1, 2, 3, 4], 2)
    pool.cache_full_blocks(blocks, hashes, 0, 2)
    assert pool.get_cached_block(hashes[0]) is None


def test_reset_prefix_cache_only_when_everything_is_free():
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(2)
    hashes = _cache(pool, blocks, [1, 2, 3, 4])
    assert pool.reset_prefix_cache() is False
    pool.free_blocks(reversed(blocks))
    assert pool.reset_prefix_cache() is True
    assert pool.get_cached_block(hashes[0]) is None
    assert all(b.block_hash is None for b in pool.blocks)


# -- chained hashes ------------------------------------------------------------------------------


def test_chained_hash_depends_on_parent_tokens_and_salt():
    h0 = hash_block_tokens(None, [1, 2, 3, 4])
    assert h0 == hash_block_tokens(NONE_HASH, [1, 2, 3, 4])
    assert isinstance(h0, bytes) and len(h0) == 32
    # same block content after a different parent -> different hash
    a = hash_token_blocks([1, 2, 3, 4, 9, 9, 9, 9], 4)
    b = hash_token_blocks([5, 2, 3, 4, 9, 9, 9, 9], 4)
    assert a[0] != b[0] and a[1] != b[1]
    # the same block content at another position -> different hash
    c = hash_token_blocks([9, 9, 9, 9, 9, 9, 9, 9], 4)
    assert c[0] != c[1]
    # the salt is injected in the first block only, but changes the whole chain
    s1 = hash_token_blocks([1, 2, 3, 4, 9, 9, 9, 9], 4, cache_salt="tenant-a")
    s2 = hash_token_blocks([1, 2, 3, 4, 9, 9, 9, 9], 4, cache_salt="tenant-b")
    assert len({a[0], s1[0], s2[0]}) == 3 and len({a[1], s1[1], s2[1]}) == 3
    assert block_extra_keys(0, "tenant-a") == ("tenant-a",)
    assert block_extra_keys(4, "tenant-a") is None
    assert s1[1] == hash_block_tokens(s1[0], [9, 9, 9, 9], None)
    # extra keys distinguish otherwise identical blocks
    assert hash_block_tokens(None, [1], ("x",)) != hash_block_tokens(None, [1], None)


def test_partial_blocks_are_not_hashed_and_incremental_equals_one_shot():
    tokens = list(range(100, 139))  # 39 tokens, block 8 -> 4 full blocks
    assert len(hash_token_blocks(tokens, 8)) == 4
    req = Request("r", tokens[:5], cache_salt="s", block_hasher=make_block_hasher(8))
    assert req.block_hashes == []
    for t in tokens[5:]:
        req.append_output_token_ids(t)
    assert req.block_hashes == hash_token_blocks(tokens, 8, cache_salt="s")
    req.append_output_token_ids([1] * 9)  # crosses one more boundary
    assert len(req.block_hashes) == 48 // 8


def test_hashes_are_stable_across_processes():
    code = (
        "from host.core.kv_cache.hashing import hash_token_blocks;"
        "print(hash_token_blocks(list(range(32)), 16, cache_salt='x')[-1].hex())"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": seed}
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert outs == {hash_token_blocks(list(range(32)), 16, cache_salt="x")[-1].hex()}
