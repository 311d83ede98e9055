"""Two engines in one process, a producer and a consumer of the ``p2p`` connector (each with its
uniproc worker and a real side channel on 127.0.0.1), driven as a PD proxy drives them: the
prompt on the producer with ``max_tokens=1`` and ``do_remote_decode``, its kv_transfer_params on
the consumer. Outputs are compared with an engine without a connector, itself checked against
transformers."""

from __future__ import annotations

import random
import socket
import time

import pytest

from helpers import hf_greedy, hf_model
from host import LLM, SamplingParams
from host.contracts.messages import EngineCoreRequest

COMMON = dict(skip_tokenizer_init=True, max_model_len=96, max_num_batched_tokens=64, max_num_seqs=6, block_size=8)
DECODE = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
PREFILL = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
IDS = iter(range(10**6))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(llm, prompts, params, kv_params, timeout=30.0):
    """Each prompt as an engine request; returns (token ids, kv_transfer_params, cached tokens)."""
    engine = llm.engine
    ids = [f"r{next(IDS)}" for _ in prompts]
    for rid, p, kvp in zip(ids, prompts, kv_params):
        engine.add_request(EngineCoreRequest(rid, list(p), params, kv_transfer_params=kvp))
    got = {rid: ([], None, 0) for rid in ids}
    done: set[str] = set()
    deadline = time.monotonic() + timeout
    while len(done) < len(ids):
        assert time.monotonic() < deadline, "requests did not finish"
        for out in engine.step().outputs:
            toks, _, _ = got[out.req_id]
            got[out.req_id] = (toks + list(out.new_token_ids), out.kv_transfer_params, out.num_cached_tokens)
            if out.finished:
                assert out.error is None, out.error
                done.add(out.req_id)
    return [got[r] for r in ids]


def settle(llm, timeout=10.0):
    """Step until the engine holds no transfers, then check every block is free."""
    engine = llm.engine
    deadline = time.monotonic() + timeout
    while engine.scheduler.has_pending_kv_transfers():
        assert time.monotonic() < deadline, "KV transfers still pending"
        engine.step()
    manager = engine.kv_cache_manager
    assert not engine.scheduler.requests
    assert manager.block_pool.get_num_free_blocks() == manager.num_blocks - 1


@pytest.fixture(scope="module")
def engines(tiny_checkpoint):
    path = str(tiny_checkpoint("llama", initializer_range=0.1, tie_word_embeddings=True))
    hf = hf_model(path)
    baseline = LLM(path, **COMMON)
    producer = LLM(path, kv_transfer_config={"kv_connector": "p2p", "kv_role": "kv_producer",
                                             "kv_connector_extra_config": {"side_channel_port": free_port()}}, **COMMON)
    consumer = LLM(path, kv_transfer_config={"kv_connector": "p2p", "kv_role": "kv_consumer",
                                             "kv_connector_extra_config": {"handshake_timeout_s": 3.0}}, **COMMON)
    yield hf, baseline, producer, consumer
    for llm in (producer, consumer, baseline):
        llm.engine.shutdown()


def pd(producer, consumer, prompts, tamper=lambda p: p):
    first = run(producer, prompts, PREFILL, [{"do_remote_decode": True}] * len(prompts))
    producer.engine.step()  # a serving engine keeps stepping: this one hands the last leases to its worker
    params = [tamper(dict(kvp)) for _, kvp, _ in first]
    assert all(p["do_remote_prefill"] for p in params)
    before = consumer.engine.scheduler.make_stats().num_prompt_tokens_computed
    out = run(consumer, prompts, DECODE, params)
    computed = consumer.engine.scheduler.make_stats().num_prompt_tokens_computed - before
    return [o[0] for o in out], [o[2] for o in out], computed, first


def test_pd_output_equals_one_engine_and_the_consumer_computes_only_last_tokens(engines):
    hf, baseline, producer, consumer = engines
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 300) for _ in range(n)] for n in (3, 8, 17, 24, 40, 57)]
    want = [o[0] for o in run(baseline, prompts, DECODE, [None] * len(prompts))]
    assert want[:2] == [hf_greedy(hf, p, 5) for p in prompts[:2]]
    got, cached, computed, first = pd(producer, consumer, prompts)
    assert got == want
    assert [f[0] for f in first] == [w[:1] for w in want]
    # one prompt token each: the rest came from the producer
    assert computed == len(prompts), consumer.engine.scheduler.make_stats().kv_connector_stats
    assert cached == [len(p) - 1 for p in prompts]
    stats = consumer.engine.scheduler.make_stats().kv_connector_stats
    assert stats["external_hit_tokens"] >= sum(len(p) for p in prompts) - len(prompts)
    assert stats["load_bytes"] > 0
    settle(consumer)
    settle(producer)  # every lease ended by the consumer's DONE: the producer's blocks are free

    # the same prompts again: full local hits on the consumer (the producer is told DONE at once);
    # and a partial hit: a known 16-token prefix with a new tail
    tail = prompts[4][:16] + [rng.randrange(3, 300) for _ in range(13)]
    again = prompts[:3] + [tail]
    want2 = want[:3] + [run(baseline, [tail], DECODE, [None])[0][0]]
    got2, cached2, computed2, _ = pd(producer, consumer, again)
    assert got2 == want2
    assert computed2 == len(again)
    settle(consumer)
    settle(producer)


def test_a_dead_producer_port_recomputes_with_the_same_output(engines):
    hf, baseline, producer, consumer = engines
    rng = random.Random(9)
    prompts = [[rng.randrange(3, 300) for _ in range(n)] for n in (12, 33)]
    want = [o[0] for o in run(baseline, prompts, DECODE, [None] * len(prompts))]
    dead = free_port()

    def tamper(p):
        p["remote_port"] = dead
        return p

    start = time.monotonic()
    got, _, computed, _ = pd(producer, consumer, prompts, tamper)
    assert got == want
    assert time.monotonic() - start < 15
    assert computed == sum(len(p) for p in prompts)  # recomputed in full
    assert consumer.engine.scheduler.make_stats().kv_connector_stats["failed_transfers"] >= 1
    settle(consumer)
    # nobody reads the producer's blocks: their leases expire (30 s) — end them as a consumer would
    from host.plugins.kv_connectors.p2p.client import call
    from host.plugins.kv_connectors.p2p.protocol import Done

    server = producer.engine.executor.worker.model_runner.kv_connector.connector.server
    for rid in list(producer.engine.scheduler.feature("kv_transfer").sending):
        call("127.0.0.1", server.port, Done(rid), 1.0)
    settle(producer)
