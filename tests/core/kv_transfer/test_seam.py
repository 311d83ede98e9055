"""The KV connector seam in the scheduler, the engine core and the model runner, driven by a
small in-memory connector written against ``host/sdk/kv_connector.py`` (the built-in ones have
their own tests under tests/plugins/kv_connectors/).

The store lives in this test process and keeps each full block's K/V by its chained hash. A
second engine in the same process finds what the first saved, as another instance (or the same
one after a restart) would find it in shared storage. Every output is compared with an engine
without a connector (and that one with transformers), so a block loaded into the wrong place,
loaded too late or freed too early shows as a different token.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
import torch

from helpers import hf_greedy, hf_model
from host import LLM, SamplingParams
from host.sdk import hookimpl
from host.sdk.kv_connector import KVConnector, KVConnectorMetadata, KVConnectorTransferResults
from host.sdk.testing import registered_plugin

STORE: dict[bytes, torch.Tensor] = {}  # block hash -> (layers, 2, block_size, heads, head_size)
HELD: dict[str, int] = {}  # producer: request id -> steps left before its hand-off is reported


@dataclass
class Plan(KVConnectorMetadata):
    loads: list[tuple[str, list[int], list[bytes]]] = field(default_factory=list)
    saves: list[tuple[int, bytes]] = field(default_factory=list)
    async_ids: set[str] = field(default_factory=set)


class MemoryConnector(KVConnector):
    """``kv_connector_extra_config``: ``async`` (load in the background, reported a step
    later), ``unknown_first`` (answer "not known yet" once per request), ``drop`` (fraction of
    loads that fail, ``seed``), ``hold_steps`` (a producer keeps finished requests' blocks for
    that many steps)."""

    name = "memory_test"

    def __init__(self, config, role):
        super().__init__(config, role)
        self.extra = config.kv_transfer.extra
        self.bs = config.cache.block_size
        self.asked: set[str] = set()
        self.pending: dict[str, list[tuple[list[int], list[bytes]]]] = {}
        self.blocks: dict[str, list[int]] = {}
        self.saved: set[bytes] = set()
        self.rng = random.Random(self.extra.get("seed", 0))
        self.results = KVConnectorTransferResults()
        self.bad: set[int] = set()
        self.recv_next: set[str] = set()
        self.hits = 0
        self.first: dict[str, int] = {}  # the first external block of each matched request

    # scheduler role
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        if self.extra.get("unknown_first") and request.request_id not in self.asked:
            self.asked.add(request.request_id)
            return None, False
        first = self.first[request.request_id] = num_computed_tokens // self.bs
        n = 0
        for h in request.block_hashes[first:]:
            if h not in STORE:
                break
            n += 1
        return n * self.bs, bool(self.extra.get("async"))

    def update_state_after_alloc(self, request, block_ids, num_external_tokens):
        if num_external_tokens <= 0:
            return
        first, n = self.first[request.request_id], -(-num_external_tokens // self.bs)
        self.pending.setdefault(request.request_id, []).append(
            (block_ids[first:first + n], request.block_hashes[first:first + n]))
        self.hits += num_external_tokens

    def build_connector_meta(self, so):
        plan = Plan()
        for rid, loads in self.pending.items():
            for ids, hashes in loads:
                plan.loads.append((rid, ids, hashes))
                if self.extra.get("async"):
                    plan.async_ids.add(rid)
        self.pending = {}
        for new in so.scheduled_new_reqs:
            self.blocks[new.req_id] = list(new.block_ids)
        for rid, ids in zip(so.scheduled_cached_reqs.req_ids, so.scheduled_cached_reqs.new_block_ids):
            self.blocks.setdefault(rid, []).extend(ids)
        return plan

    def request_finished(self, request, block_ids):
        self.blocks.pop(request.request_id, None)
        if self.extra.get("hold_steps") and block_ids:
            HELD[request.request_id] = self.extra["hold_steps"]
            return True, {"held_blocks": len(block_ids)}
        return False, None

    def get_stats(self):
        hits, self.hits = self.hits, 0
        return {"external_hit_tokens": hits}

    # worker role
    def register_kv_caches(self, kv_caches):
        self.layers = list(kv_caches.values())

    def start_load_kv(self, forward_context):
        for rid, ids, hashes in self._metadata.loads:
            if self.extra.get("drop") and self.rng.random() < self.extra["drop"]:
                self.bad.update(ids)
                if rid in self._metadata.async_ids:
                    self.results.failed_recving.add(rid)
                    self.recv_next.add(rid)
                continue
            for b, h in zip(ids, hashes):
                for layer, kv in enumerate(self.layers):
                    kv[:, b].copy_(STORE[h][layer])
            if rid in self._metadata.async_ids:
                self.recv_next.add(rid)

    def wait_for_save(self):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata):
        pass

    def get_transfer_results(self):
        out, self.results = self.results, KVConnectorTransferResults()
        out.finished_recving |= self.recv_next
        self.recv_next = set()
        for rid in list(HELD):
            HELD[rid] -= 1
            if HELD[rid] <= 0:
                del HELD[rid]
                out.finished_sending.add(rid)
        return out

    def get_block_ids_with_load_errors(self):
        bad, self.bad = self.bad, set()
        return bad


def save_all(llm):
    """Put every cached full block of ``llm``'s prefix cache into the store (what a saving
    connector does after each step; done here at the end, which the seam tests do not need to
    exercise)."""
    runner = llm.engine.executor.worker.model_runner
    pool = llm.engine.kv_cache_manager.block_pool
    for block in pool.blocks:
        if block.block_hash is not None:
            STORE[block.block_hash] = torch.stack([runner.kv_caches[i][:, block.block_id].clone() for i in runner.kv_layers])


class MemoryPlugin:
    @hookimpl
    def host_register_kv_connectors(self, register):
        register(MemoryConnector)


@pytest.fixture(autouse=True)
def registered():
    STORE.clear()
    HELD.clear()
    with registered_plugin(MemoryPlugin(), name="memory_test", group="host.kv_connectors"):
        yield


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    path = tiny_checkpoint("llama", initializer_range=0.1, tie_word_embeddings=True)
    return str(path), hf_model(path)


COMMON = dict(skip_tokenizer_init=True, max_model_len=96, max_num_batched_tokens=32, max_num_seqs=6, block_size=8)
GREEDY = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)


def prompts(seed, lengths):
    rng = random.Random(seed)
    return [[rng.randrange(3, 300) for _ in range(n)] for n in lengths]


def run(llm, ps, params=GREEDY):
    return llm.generate([{"prompt_token_ids": p} for p in ps], params)


def no_leaks(llm):
    manager = llm.engine.kv_cache_manager
    assert not llm.engine.scheduler.requests
    assert not llm.engine.scheduler.has_pending_kv_transfers()
    assert manager.block_pool.get_num_free_blocks() == manager.num_blocks - 1


def connector_llm(path, **extra):
    kw = dict(COMMON)
    kw.update(extra.pop("engine", {}))
    return LLM(path, kv_transfer_config={"kv_connector": "memory_test", "kv_connector_extra_config": extra,
                                         "kv_load_failure_policy": extra.pop("policy", "recompute")}, **kw)


@pytest.fixture(scope="module")
def reference(tiny):
    path, hf = tiny
    ps = prompts(3, [3, 8, 17, 24, 40, 57])  # shorter than a block, exactly one, partial, ...
    baseline = LLM(path, **COMMON)
    want = [o.outputs[0].token_ids for o in run(baseline, ps)]
    assert want == [hf_greedy(hf, p, 5) for p in ps]
    save_all(baseline)
    snapshot = dict(STORE)
    return ps, want, snapshot


@pytest.mark.parametrize("mode", ["sync", "sync_async_scheduling", "async", "async_unknown_first"])
def test_external_blocks_replace_the_prefill_and_keep_the_tokens(tiny, reference, mode):
    ps, want, snapshot = reference
    STORE.update(snapshot)
    extra = {"async": mode.startswith("async"), "unknown_first": mode == "async_unknown_first",
             "engine": {"async_scheduling": mode == "sync_async_scheduling"}}
    llm = connector_llm(tiny[0], **extra)
    got = run(llm, ps)
    assert [o.outputs[0].token_ids for o in got] == want
    full_blocks = [len(p) // 8 * 8 for p in ps]
    # every full block came from the store (a fully stored prompt recomputes its last token)
    assert [o.num_cached_tokens for o in got] == [min(n, len(p) - 1) for n, p in zip(full_blocks, ps)]
    stats = llm.engine.scheduler.make_stats()
    assert stats.num_prompt_tokens_computed == sum(len(p) - min(n, len(p) - 1) for n, p in zip(full_blocks, ps))
    assert stats.kv_connector_stats["external_hit_tokens"] == sum(full_blocks)
    no_leaks(llm)
    # the loaded blocks are in the local prefix cache now: the same prompts hit locally
    again = run(llm, ps)
    assert [o.outputs[0].token_ids for o in again] == want
    no_leaks(llm)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_failed_loads_recompute_from_the_first_bad_block(tiny, reference, mode):
    ps, want, snapshot = reference
    STORE.update(snapshot)
    llm = connector_llm(tiny[0], drop=0.5, seed=7, **{"async": mode == "async"})
    got = run(llm, ps)
    assert [o.outputs[0].token_ids for o in got] == want
    stats = llm.engine.scheduler.make_stats().kv_connector_stats
    assert stats["failed_loads"] >= 1
    no_leaks(llm)
    # nothing bad entered the prefix cache: the second run is still exact
    assert [o.outputs[0].token_ids for o in run(llm, ps)] == want
    no_leaks(llm)


def test_fail_policy_fails_the_request_with_the_reason(tiny, reference):
    ps, want, snapshot = reference
    STORE.update(snapshot)
    llm = connector_llm(tiny[0], drop=1.0, policy="fail")
    with pytest.raises(Exception, match="kv_load_failure_policy=fail"):
        run(llm, [ps[3]])
    no_leaks(llm)
    # a prompt with nothing stored runs as usual
    assert run(llm, [[7, 8, 9]])[0].outputs[0].token_ids == hf_greedy(tiny[1], [7, 8, 9], 5)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_producer_keeps_blocks_until_the_hand_off_is_reported(tiny, reference, async_scheduling):
    ps, want, _ = reference
    llm = connector_llm(tiny[0], hold_steps=3, engine={"async_scheduling": async_scheduling})
    engine = llm.engine
    got = run(llm, ps[:3], SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in got] == [w[:1] for w in want[:3]]
    held = engine.scheduler.kv_source.num_held_blocks()
    assert held == sum(-(-len(p) // 8) for p in ps[:3])  # every block of every prompt
    assert engine.has_unfinished_requests()  # the engine keeps stepping for the hand-offs
    for _ in range(10):
        if not engine.scheduler.has_pending_kv_transfers():
            break
        engine.step()
    no_leaks(llm)


def test_preempted_and_aborted_requests_hand_nothing_off(tiny, reference):
    """A producer short of blocks: requests are preempted and recomputed; each hands off exactly
    its own blocks once it finished, with the right tokens; one aborted while queued and one
    aborted mid-prefill hand off nothing."""
    ps, want, _ = reference
    llm = connector_llm(tiny[0], hold_steps=1, engine={"num_gpu_blocks_override": 10, "max_num_batched_tokens": 16})
    engine, finished = llm.engine, {}
    original = MemoryConnector.request_finished

    def spy(self, request, block_ids):
        finished[request.request_id] = list(block_ids)
        return original(self, request, block_ids)

    MemoryConnector.request_finished = spy
    try:
        got = run(llm, ps[2:6])
        assert [o.outputs[0].token_ids for o in got] == want[2:6]
        assert engine.scheduler.num_preemptions > 0
        # every block of prompt + output but the last token (sampled, never written to the cache)
        assert sorted(len(b) for b in finished.values()) == sorted(-(-(len(p) + 4) // 8) for p in ps[2:6])
        while engine.has_unfinished_requests():
            engine.step()
        finished.clear()
        from host.contracts.messages import EngineCoreRequest

        for rid, p in (("queued", ps[4]), ("mid-prefill", ps[5])):
            engine.add_request(EngineCoreRequest(rid, p, SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)))
        engine.step()  # "mid-prefill" now holds blocks for its first chunk
        engine.abort_requests(["queued", "mid-prefill"])
        assert finished == {"queued": [], "mid-prefill": []}
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        MemoryConnector.request_finished = original
    no_leaks(llm)
