"""The hybrid KV cache allocator: layer grouping, per-group tables over one block pool, windows
that free their blocks as they slide, prefix hits every group can serve, no leaks."""

from __future__ import annotations

import random

import pytest

from host.contracts.request import Request
from host.core.kv_cache.coordinator import GroupedBlocks, HybridKVCacheManager
from host.core.kv_cache.groups import plan_kv_cache_layout
from host.core.kv_cache.hashing import make_block_hasher
from host.core.kv_cache.manager import KVCacheManager, make_kv_cache_manager
from host.core.kv_cache.spec import FullAttentionSpec, KVCacheConfig, SlidingWindowSpec, num_blocks_from_memory


def gemma3_specs(block_size: int = 16, window: int = 512) -> list:
    """Gemma-3-270M's KV shape: 18 layers, every 6th full attention, the rest a 512-token window;
    1 KV head of 256, bfloat16."""
    return [
        FullAttentionSpec(block_size, 1, 256, "bfloat16") if i % 6 == 5
        else SlidingWindowSpec(block_size, 1, 256, "bfloat16", sliding_window=window)
        for i in range(18)
    ]


def make_manager(specs, num_blocks: int, hybrid: bool = True, caching: bool = True):
    layout = plan_kv_cache_layout(specs, hybrid=hybrid)
    config = KVCacheConfig(num_blocks, specs[0].block_size, specs, layout=layout)
    return make_kv_cache_manager(config, enable_caching=caching)


def make_request(req_id: str, tokens: list[int], block_size: int) -> Request:
    return Request(req_id, tokens, block_hasher=make_block_hasher(block_size))


def run(m, req: Request, n: int, hit=None, num_hit: int = 0):
    """Allocate ``n`` tokens (after a prefix hit at admission) and count them computed, as the scheduler does."""
    new = m.allocate_slots(req, n, hit, num_hit)
    assert new is not None, f"{req.request_id}: {n} tokens did not fit"
    req.num_computed_tokens += num_hit + n
    return new


def decode(m, req: Request, token: int) -> None:
    """One decode step: the token sampled last step is appended, then its KV slot allocated."""
    req.append_output_token_ids(token)
    run(m, req, 1)


def held(m) -> int:
    return m.block_pool.num_blocks - 1 - m.num_free_blocks


# -- grouping ------------------------------------------------------------------------------------


def test_gemma3_layout_is_six_groups_of_three_layers():
    layout = plan_kv_cache_layout(gemma3_specs())
    assert layout.group_size == 3 and layout.num_groups == 6
    kinds = [type(g.spec).__name__ for g in layout.groups]
    assert kinds == ["FullAttentionSpec"] + ["SlidingWindowSpec"] * 5
    assert layout.groups[0].layers == (5, 11, 17)
    assert [g.layers for g in layout.groups[1:]] == [(0, 1, 2), (3, 4, 6), (7, 8, 9), (10, 12, 13), (14, 15, 16)]
    all_layers = sorted(layer for g in layout.groups for layer in g.layers)
    assert all_layers == list(range(18))
    page = 2 * 16 * 1 * 256 * 2
    assert layout.page_size_bytes == 3 * page
    # without the hybrid allocator: one group, one block holds every layer's page
    single = plan_kv_cache_layout(gemma3_specs(), hybrid=False)
    assert single.num_groups == 1 and single.page_size_bytes == 18 * page
    assert isinstance(make_manager(gemma3_specs(), 100, hybrid=False), KVCacheManager)
    assert isinstance(make_manager(gemma3_specs(), 100), HybridKVCacheManager)


def test_uneven_counts_pad_the_last_group_and_mixed_windows_group_apart():
    specs = [FullAttentionSpec(4, 1, 8, "float32")] * 2 + [SlidingWindowSpec(4, 1, 8, "float32", sliding_window=8)] * 5
    layout = plan_kv_cache_layout(specs)
    assert layout.group_size == 2
    assert [len(g.layers) for g in layout.groups] == [2, 2, 2, 1]  # the last sliding group is padded
    windows = [SlidingWindowSpec(4, 1, 8, "float32", sliding_window=w) for w in (8, 8, 16, 16)]
    layout = plan_kv_cache_layout(windows)
    assert [g.spec.sliding_window for g in layout.groups] == [8, 16]
    # different page sizes cannot share equal-size groups: one group
    mixed = [FullAttentionSpec(4, 1, 8, "float32"), SlidingWindowSpec(4, 2, 8, "float32", sliding_window=8)]
    assert plan_kv_cache_layout(mixed).num_groups == 1


def test_layers_all_of_one_window_make_one_sliding_group():
    specs = [SlidingWindowSpec(4, 1, 8, "float32", sliding_window=8)] * 3
    layout = plan_kv_cache_layout(specs)
    assert layout.num_groups == 1 and not layout.is_hybrid and layout.frees_windows
    assert layout.page_size_bytes == 3 * specs[0].page_size_bytes
    m = make_manager(specs, 64)
    assert isinstance(m, HybridKVCacheManager) and m.num_groups == 1
    req = make_request("r", list(range(30)), 4)
    run(m, req, 30)
    decode(m, req, 1)  # starts at 30: the window reads from 23, block 5 on
    assert m.get_group_block_ids("r") == [[0] * 5 + m.get_group_block_ids("r")[0][5:]]
    assert held(m) == 8 - 5
    # without hybrid groups: every token kept, as full attention
    single = plan_kv_cache_layout(specs, hybrid=False)
    assert not single.frees_windows and isinstance(make_manager(specs, 64, hybrid=False), KVCacheManager)
    m.free(req)
    assert held(m) == 0


def test_sizing_counts_group_pages_and_the_windows():
    specs = gemma3_specs()
    layout = plan_kv_cache_layout(specs)
    page3 = 3 * 2 * 16 * 256 * 2
    assert num_blocks_from_memory(page3 * 1000, specs, layout=layout) == 1000
    # one 8192-token request: 512 full blocks + 5 windows of (511 / 16 -> 32) + 1 blocks, + null
    assert layout.blocks_per_request(8192) == 512 + 5 * 33
    with pytest.raises(ValueError, match="678 blocks"):
        num_blocks_from_memory(page3 * 600, specs, max_model_len=8192, layout=layout)


# -- blocks held ---------------------------------------------------------------------------------


@pytest.mark.parametrize("hybrid", [True, False])
def test_gemma3_request_of_8192_tokens_holds_the_hand_computed_blocks(hybrid):
    bs, window = 16, 512
    m = make_manager(gemma3_specs(bs, window), num_blocks=4000, hybrid=hybrid, caching=False)
    req = make_request("r", [i % 1000 for i in range(8192)], bs)
    for _ in range(4):  # chunked prefill: 4 chunks of 2048 tokens
        run(m, req, 2048)
    decode(m, req, 7)  # the first decode step: 8193 tokens
    total_blocks = -(-8193 // bs)  # 513
    if not hybrid:
        assert held(m) == total_blocks  # one block = a page of all 18 layers
        layer_pages = total_blocks * 18
    else:
        # the full group keeps all 513; each of the 5 sliding groups keeps the blocks from the
        # first one the window of position 8192 reads: (8192 - 512 + 1) // 16 = 480 -> 33 blocks
        first_needed = (8192 - window + 1) // bs
        assert first_needed == 480
        expected = total_blocks + 5 * (total_blocks - first_needed)
        assert held(m) == expected == 678
        layer_pages = expected * 3
        tables = m.get_group_block_ids("r")
        assert all(b != 0 for b in tables[0])  # full attention: no null entries
        for table in tables[1:]:
            assert table[:first_needed] == [0] * first_needed and 0 not in table[first_needed:]
    # memory: about 1/6 plus the windows' share of the non-hybrid cache
    ratio = (678 * 3) / (513 * 18)
    assert ratio == pytest.approx(1 / 6 + 5 / 6 * 33 / 513)
    assert layer_pages == (678 * 3 if hybrid else 513 * 18)
    m.free(req)
    assert held(m) == 0


def two_group_manager(num_blocks: int = 64, window: int = 8, caching: bool = True) -> HybridKVCacheManager:
    """Block size 4: one full-attention layer and one layer with an 8-token window."""
    specs = [FullAttentionSpec(4, 1, 8, "float32"), SlidingWindowSpec(4, 1, 8, "float32", sliding_window=window)]
    m = make_manager(specs, num_blocks, caching=caching)
    assert isinstance(m, HybridKVCacheManager) and m.num_groups == 2
    return m


def test_window_frees_blocks_as_it_slides_during_decode():
    m = two_group_manager()
    req = make_request("r", list(range(10)), 4)
    run(m, req, 10)  # 3 blocks in each group
    assert held(m) == 6
    for step in range(30):
        decode(m, req, 100 + step)
        computed_before = req.num_computed_tokens - 1  # the step started with this many computed
        first_needed = max(0, computed_before - 8 + 1) // 4
        full, sliding = m.get_group_block_ids("r")
        n_blocks = -(-req.num_computed_tokens // 4)
        assert len(full) == len(sliding) == n_blocks
        assert sliding[:first_needed] == [0] * first_needed and 0 not in sliding[first_needed:]
        assert held(m) == n_blocks + (n_blocks - first_needed)
    # the window never holds more than ceil((8 - 1) / 4) + 1 = 3 blocks
    assert m.num_blocks_held("r") - len(m.get_group_block_ids("r")[0]) <= 3
    m.free(req)
    assert held(m) == 0


def test_chunked_prefill_keeps_the_window_of_each_chunks_first_token():
    m = two_group_manager()
    req = make_request("r", list(range(40)), 4)
    run(m, req, 12)
    run(m, req, 12)  # started at 12: the window of token 12 reads from 5 -> block 1 on
    sliding = m.get_group_block_ids("r")[1]
    assert sliding[:1] == [0] and 0 not in sliding[1:6]
    run(m, req, 16)  # started at 24: reads from 17 -> block 4 on
    sliding = m.get_group_block_ids("r")[1]
    assert sliding[:4] == [0] * 4 and 0 not in sliding[4:]


# -- prefix cache --------------------------------------------------------------------------------


def _running_a_with_old_window_blocks_evicted(m, num_evicted: int) -> Request:
    """Request ``a`` (prompt 0..40) decodes to 56 tokens, so its window freed sliding blocks
    0..11 (still cached, oldest first in the free queue); then another user of the pool takes
    the never-used free blocks and ``num_evicted`` of those, evicting sliding blocks 0.."""
    a = make_request("a", list(range(41)), 4)
    run(m, a, 41)
    for t in range(15):
        decode(m, a, 500 + t)
    assert a.num_computed_tokens == 56
    pool = m.block_pool
    hashed_free = sum(1 for b in pool.free_block_queue.get_all_free_blocks() if b.block_hash is not None)
    assert hashed_free == (56 - 7) // 4  # sliding blocks 0..11, freed as the window slid
    pool.get_new_blocks(pool.get_num_free_blocks() - hashed_free + num_evicted)
    return a


def test_prefix_hit_needs_only_the_window_blocks_of_a_sliding_group():
    m = two_group_manager(num_blocks=80)
    _running_a_with_old_window_blocks_evicted(m, num_evicted=4)  # sliding 0..3 gone, 4.. cached
    b = make_request("b", list(range(24)) + [999] * 5, 4)
    hit, num_hit = m.get_computed_blocks(b)
    # the full group has blocks 0..5 of the shared 24 tokens; the window of token 24 reads
    # from 17, i.e. blocks 4 and 5, which are cached: the hit is all 24 tokens
    assert num_hit == 24 and isinstance(hit, GroupedBlocks)
    assert len(hit.groups[0]) == 6 and all(not blk.is_null for blk in hit.groups[0])
    assert [blk.is_null for blk in hit.groups[1]] == [True] * 4 + [False] * 2
    run(m, b, 5, hit, num_hit)
    assert m.get_group_block_ids("b")[1][:4] == [0] * 4


def test_prefix_hit_is_limited_by_a_sliding_group_missing_its_window():
    m = two_group_manager(num_blocks=80)
    _running_a_with_old_window_blocks_evicted(m, num_evicted=5)  # sliding 0..4 gone
    b = make_request("b", list(range(24)) + [999] * 5, 4)
    full_hit = m.groups[0].find_longest_cache_hit(b.block_hashes, 7)
    assert len(full_hit) == 6  # the full group alone would serve 24 tokens
    # but the window ending at block 6 needs sliding block 4 (evicted), the one ending at 4
    # needs 2 and 3, ... : no end has its window cached
    hit, num_hit = m.get_computed_blocks(b)
    assert num_hit == 0 and not hit


def test_prefix_hit_of_a_finished_request_covers_every_group():
    m = two_group_manager()
    a = make_request("a", list(range(33)), 4)
    run(m, a, 33)
    m.free(a)
    b = make_request("b", list(range(33)), 4)
    hit, num_hit = m.get_computed_blocks(b)
    assert num_hit == 32  # 8 full blocks, the last token recomputed
    assert len(hit.groups[0]) == len(hit.groups[1]) == 8
    # the sliding group's hit keeps just the window of token 32: blocks 6 and 7
    assert [blk.is_null for blk in hit.groups[1]] == [True] * 6 + [False] * 2
    assert m.prefix_cache_stats.hits == 0
    run(m, b, 1, hit, num_hit)
    assert m.prefix_cache_stats.hits == 32
    assert m.num_blocks_held("b") == 9 + 3


# -- preemption and leaks ------------------------------------------------------------------------


def test_preemption_frees_every_group_and_the_pool_returns_to_full():
    m = two_group_manager(num_blocks=40)
    reqs = [make_request(f"r{i}", [i * 100 + t for t in range(20)], 4) for i in range(3)]
    for r in reqs:
        run(m, r, 20)
    for step in range(6):
        for r in reqs:
            decode(m, r, step)
    assert held(m) > 0
    for r in reqs:  # preemption by recompute: free, forget progress
        m.free(r)
        r.num_computed_tokens = 0
    assert held(m) == 0
    assert all(b.ref_cnt == 0 for b in m.block_pool.blocks)
    assert m.block_pool.get_num_free_blocks() == m.block_pool.num_blocks - 1
    # resumed: the prefix cache gives back what the windows and full layers need
    hit, num_hit = m.get_computed_blocks(reqs[0])
    assert num_hit == (reqs[0].num_tokens - 1) // 4 * 4


def test_allocation_is_all_or_nothing_across_groups():
    m = two_group_manager(num_blocks=8)  # 7 usable
    a = make_request("a", list(range(12)), 4)
    assert m.allocate_slots(a, 12) is not None  # 3 + 3 blocks
    b = make_request("b", list(range(100, 104)), 4)
    assert m.allocate_slots(b, 4) is None  # needs 1 block per group: 2, only 1 free
    assert m.get_group_block_ids("b") == [[], []] and held(m) == 6
    m.free(a)
    assert held(m) == 0


def _check_pool(m: HybridKVCacheManager) -> None:
    refs: dict[int, int] = {}
    for group in m.groups:
        for blocks in group.req_to_blocks.values():
            for b in blocks:
                if not b.is_null:
                    refs[b.block_id] = refs.get(b.block_id, 0) + 1
    pool = m.block_pool
    for b in pool.blocks[1:]:
        assert b.ref_cnt == refs.get(b.block_id, 0), b
    assert pool.get_num_free_blocks() == sum(1 for b in pool.blocks[1:] if b.ref_cnt == 0)


def test_no_block_leaks_over_random_admit_finish_preempt_sequences():
    rng = random.Random(1234)
    specs = [FullAttentionSpec(4, 1, 8, "float32")] * 2 + [SlidingWindowSpec(4, 1, 8, "float32", sliding_window=w) for w in (6, 6, 11, 11)]
    m = make_manager(specs, num_blocks=60)
    assert m.num_groups == 3
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(1, 30))] for _ in range(4)]
    waiting: list[Request] = []
    running: list[Request] = []
    num_preempted = 0
    for i in range(400):
        op = rng.random()
        if op < 0.3 or not running:
            tokens = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(1, 12))]
            waiting.append(make_request(f"q{i}", tokens, 4))
        if waiting and op < 0.6:
            req = waiting[0]
            if req.num_computed_tokens == 0:
                hit, num_hit = m.get_computed_blocks(req)
            else:
                hit, num_hit = [], 0
            chunk = min(req.num_tokens - num_hit - req.num_computed_tokens, rng.randrange(1, 16))
            if m.allocate_slots(req, chunk, hit, num_hit) is not None:
                req.num_computed_tokens += num_hit + chunk
                if req.num_computed_tokens == req.num_tokens:
                    running.append(waiting.pop(0))
        elif running and op < 0.85:
            req = rng.choice(running)
            if req.num_tokens == req.num_computed_tokens:
                req.append_output_token_ids(rng.randrange(50))
            n = req.num_tokens - req.num_computed_tokens
            while m.allocate_slots(req, n) is None:
                victim = running.pop()  # preempt the newest (maybe req itself)
                m.free(victim)
                victim.num_computed_tokens = 0
                waiting.insert(0, victim)
                num_preempted += 1
                if victim is req:
                    break
            else:
                req.num_computed_tokens += n
        elif running:
            m.free(running.pop(rng.randrange(len(running))))
        _check_pool(m)
    assert num_preempted > 0 and m.prefix_cache_stats.hits > 0  # the loop did exercise both
    for req in running + waiting:
        m.free(req)
    _check_pool(m)
    assert held(m) == 0
