"""KV cache specs, sizing, and the KV cache manager (prefix hits, slot allocation, no leaks)."""

from __future__ import annotations

import dataclasses

import pytest

from host.contracts.request import Request
from host.core.kv_cache.hashing import make_block_hasher
from host.core.kv_cache.manager import KVCacheManager, check_kv_cache_specs, get_manager_class, register_kv_cache_manager
from host.core.kv_cache.spec import (
    AttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheSpec,
    SlidingWindowSpec,
    num_blocks_from_memory,
)

BS = 4


# -- specs and sizing ----------------------------------------------------------------------------


def test_spec_is_frozen_and_page_size_is_k_plus_v():
    spec = FullAttentionSpec(block_size=16, num_kv_heads=32, head_size=128, dtype="float16")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.block_size = 32  # type: ignore[misc]
    assert spec.page_size_bytes == 2 * 16 * 32 * 128 * 2
    assert FullAttentionSpec(16, 8, 64, "torch.float32").page_size_bytes == 2 * 16 * 8 * 64 * 4
    assert spec.max_memory_usage_bytes(33) == 3 * spec.page_size_bytes
    sw = SlidingWindowSpec(16, 8, 64, "bfloat16", sliding_window=128)
    assert sw.page_size_bytes == 2 * 16 * 8 * 64 * 2
    with pytest.raises(ValueError, match="dtype"):
        FullAttentionSpec(16, 8, 64, "float64")
    with pytest.raises(ValueError, match="num_kv_heads"):
        FullAttentionSpec(16, 0, 64, "float16")
    with pytest.raises(ValueError, match="sliding_window"):
        SlidingWindowSpec(16, 8, 64, "float16")


def test_manager_registry_walks_the_mro_and_rejects_unregistered_specs():
    @dataclasses.dataclass(frozen=True)
    class MyFullSpec(FullAttentionSpec):
        pass

    @dataclasses.dataclass(frozen=True)
    class OddSpec(AttentionSpec):
        pass

    assert get_manager_class(FullAttentionSpec) is KVCacheManager
    assert get_manager_class(SlidingWindowSpec) is KVCacheManager
    assert get_manager_class(MyFullSpec) is KVCacheManager  # inherited through the MRO
    with pytest.raises(ValueError, match="OddSpec.*register_kv_cache_manager"):
        get_manager_class(OddSpec)
    with pytest.raises(ValueError, match="OddSpec"):
        KVCacheManager(KVCacheConfig(8, 16, [OddSpec(16, 1, 8, "float16")]))

    class OtherManager:
        pass

    register_kv_cache_manager(OddSpec, OtherManager)
    assert get_manager_class(OddSpec) is OtherManager
    with pytest.raises(ValueError, match="hybrid"):
        check_kv_cache_specs([FullAttentionSpec(16, 1, 8, "float16"), OddSpec(16, 1, 8, "float16")])
    with pytest.raises(TypeError):
        register_kv_cache_manager(int, OtherManager)  # type: ignore[arg-type]


def test_kv_cache_config_and_num_blocks_from_memory():
    specs = [FullAttentionSpec(16, 2, 64, "float16") for _ in range(4)]
    per_block = 4 * 2 * 16 * 2 * 64 * 2
    assert num_blocks_from_memory(per_block * 100 + 5, specs) == 100
    assert num_blocks_from_memory(per_block * 100, specs, max_model_len=1024) == 100
    cfg = KVCacheConfig(num_blocks=100, block_size=16, kv_cache_specs=specs)
    assert cfg.page_size_bytes == per_block and cfg.kv_cache_bytes == 100 * per_block
    # 2048 tokens need 128 blocks + the null block
    with pytest.raises(ValueError, match="--kv-cache-memory") as err:
        num_blocks_from_memory(per_block * 100, specs, max_model_len=2048)
    assert "max_model_len=2048" in str(err.value) and "129 blocks" in str(err.value)
    with pytest.raises(ValueError, match="block_size"):
        KVCacheConfig(10, 32, specs)
    with pytest.raises(ValueError, match="num_blocks"):
        KVCacheConfig(1, 16, specs)
    manager = KVCacheManager(cfg, max_model_len=1024)
    assert manager.num_blocks == 100 and manager.block_size == 16 and manager.num_free_blocks == 99
    assert issubclass(FullAttentionSpec, KVCacheSpec)


# -- manager -------------------------------------------------------------------------------------


def make_request(req_id: str, tokens: list[int], salt: str | None = None) -> Request:
    return Request(req_id, tokens, cache_salt=salt, block_hasher=make_block_hasher(BS))


def admit(manager: KVCacheManager, req: Request, num_new: int | None = None):
    """Prefix lookup + allocation + mark as computed, like the scheduler at admission."""
    hit, num_hit = manager.get_computed_blocks(req)
    n = req.num_tokens - num_hit if num_new is None else num_new
    new = manager.allocate_slots(req, n, hit, num_hit)
    if new is None:
        return None
    req.num_computed_tokens = num_hit + n
    return hit, num_hit, new


def assert_all_free(manager: KVCacheManager):
    pool = manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_blocks - 1
    assert all(b.ref_cnt == 0 for b in pool.blocks)
    assert not manager.req_to_blocks


def test_allocate_and_free_a_request():
    m = KVCacheManager(num_blocks=8, block_size=BS)
    r = make_request("a", list(range(10)))
    _, num_hit, new = admit(m, r)
    assert num_hit == 0 and len(new) == 3 and m.get_block_ids("a") == [b.block_id for b in new]
    assert m.usage == pytest.approx(3 / 7)
    # a decode that stays inside the last block needs no new block
    r.append_output_token_ids(10)
    assert m.allocate_slots(r, 1) == []
    r.num_computed_tokens += 1
    r.append_output_token_ids(11)
    assert m.allocate_slots(r, 1) == []
    r.num_computed_tokens += 1
    r.append_output_token_ids(12)
    assert len(m.allocate_slots(r, 1)) == 1  # token 12 starts block 4
    with pytest.raises(ValueError):
        m.allocate_slots(r, 0)
    m.free(r)
    assert_all_free(m)


def test_allocation_fails_cleanly_when_blocks_run_out():
    m = KVCacheManager(num_blocks=4, block_size=BS)  # 3 usable
    a = make_request("a", list(range(8)))
    admit(m, a)
    b = make_request("b", list(range(100, 112)))  # needs 3 blocks, 1 free
    assert m.allocate_slots(b, 12) is None
    assert m.get_block_ids("b") == [] and m.num_free_blocks == 1
    assert m.allocate_slots(b, 4) is not None  # a first chunk fits
    m.free(a)
    m.free(b)
    assert_all_free(m)


def test_fully_cached_prompt_of_k_blocks_hits_k_minus_1_blocks():
    m = KVCacheManager(num_blocks=16, block_size=BS)
    prompt = list(range(16))  # exactly 4 blocks
    a = make_request("a", prompt)
    admit(m, a)
    m.free(a)
    b = make_request("b", prompt)
    hit, num_hit = m.get_computed_blocks(b)
    assert len(hit) == 3 and num_hit == 12  # the last token must be recomputed
    # one more token: all 4 blocks hit, 1 token left to compute
    c = make_request("c", prompt + [99])
    hit, num_hit = m.get_computed_blocks(c)
    assert len(hit) == 4 and num_hit == 16
    _, _, new = admit(m, c)
    assert len(new) == 1 and c.num_computed_tokens == 17
    m.free(c)
    assert_all_free(m)


def test_shared_prefix_is_computed_once_and_hit_rate_is_reported():
    m = KVCacheManager(num_blocks=64, block_size=BS)
    prefix = list(range(1000, 1064))  # 64 tokens = 16 blocks
    a = make_request("a", prefix + [1, 2, 3])
    b = make_request("b", prefix + [4, 5, 6, 7, 8])
    _, hit_a, new_a = admit(m, a)
    _, hit_b, new_b = admit(m, b)  # a is still running: its blocks are shared
    assert hit_a == 0 and len(new_a) == 17
    assert hit_b == 64 and len(new_b) == 2
    assert m.get_block_ids("b")[:16] == m.get_block_ids("a")[:16]
    assert all(blk.ref_cnt == 2 for blk in m.get_blocks("a")[:16])
    stats = m.prefix_cache_stats
    assert (stats.requests, stats.queries, stats.hits) == (2, 67 + 69, 64)
    assert stats.hit_rate == pytest.approx(64 / 136)
    # a salted request shares nothing
    c = make_request("c", prefix + [1, 2, 3], salt="other-tenant")
    assert m.get_computed_blocks(c) == ([], 0)
    m.free(a)
    assert all(blk.ref_cnt == 1 for blk in m.get_blocks("b")[:16])
    m.free(b)
    assert_all_free(m)


def test_prefix_hits_in_the_free_queue_count_against_free_blocks():
    m = KVCacheManager(num_blocks=5, block_size=BS)  # 4 usable
    prompt = list(range(16))
    a = make_request("a", prompt)
    admit(m, a)
    m.free(a)  # 4 free blocks, all cached
    b = make_request("b", prompt + [50, 51])  # hits 4 blocks, needs 1 more
    hit, num_hit = m.get_computed_blocks(b)
    assert num_hit == 16 and m.num_free_blocks == 4
    # touching the 4 hits leaves 0 allocatable blocks: must fail, not crash
    assert m.allocate_slots(b, 2, hit, num_hit) is None
    assert all(blk.ref_cnt == 0 for blk in hit) and m.num_free_blocks == 4
    # a request hitting 3 of them and needing 1 new block fits exactly
    c = make_request("c", prompt[:12] + [60, 61])
    hit, num_hit = m.get_computed_blocks(c)
    assert num_hit == 12
    assert len(m.allocate_slots(c, 2, hit, num_hit)) == 1  # evicts a's 4th block
    assert m.block_pool.get_cached_block(a.block_hashes[3]) is None
    m.free(c)
    assert_all_free(m)


def test_freed_hashed_blocks_are_reused_until_evicted_lru():
    m = KVCacheManager(num_blocks=9, block_size=BS)  # 8 usable
    p1 = list(range(16))  # 4 blocks
    a = make_request("a", p1)
    admit(m, a)
    m.free(a)
    # an unrelated 2-block request takes the never-used blocks first
    x = make_request("x", list(range(500, 508)))
    admit(m, x)
    m.free(x)
    a2 = make_request("a2", p1 + [1])
    assert m.get_computed_blocks(a2)[1] == 16  # all of a's blocks survived
    # free queue now: 7, 8 (never used), a's blocks tail first, then x's (freed last).
    # 4 blocks of new content take 7, 8 and then evict a's last two blocks
    y = make_request("y", list(range(700, 716)))
    admit(m, y)
    hit, num_hit = m.get_computed_blocks(a2)
    assert num_hit == 8  # a's two last blocks were evicted (tail first)
    m.free(y)
    assert_all_free(m)


def test_caching_disabled_never_hits():
    m = KVCacheManager(num_blocks=9, block_size=BS, enable_caching=False)
    a = make_request("a", list(range(16)))
    admit(m, a)
    m.free(a)
    assert m.get_computed_blocks(make_request("b", list(range(16)) + [1])) == ([], 0)
    assert m.prefix_cache_stats.queries == 0
    assert_all_free(m)


def test_reset_prefix_cache():
    m = KVCacheManager(num_blocks=9, block_size=BS)
    a = make_request("a", list(range(16)))
    admit(m, a)
    assert m.reset_prefix_cache() is False
    m.free(a)
    assert m.reset_prefix_cache() is True
    assert m.get_computed_blocks(make_request("b", list(range(16)) + [1])) == ([], 0)
    assert_all_free(m)


def test_manager_needs_a_size():
    with pytest.raises(ValueError, match="num_blocks"):
        KVCacheManager(block_size=16)
