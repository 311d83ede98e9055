"""The batch queue (pipeline parallelism's engine side) on a real one-process engine: several
launched steps in flight, outputs processed in launch order, a request never in two unprocessed
steps. Pipelining only changes which requests share a step, so every token must equal the
one-step-at-a-time engine's (and transformers' greedy tokens); the multi-process pipeline runs
in tests/core/worker/test_pipeline_parallel.py."""

from __future__ import annotations

import collections
import random

import pytest

from helpers import hf_greedy, hf_model
from host import LLM, SamplingParams
from host.contracts.request import Request, RequestStatus
from host.core.engine.batch_queue import BatchQueue

DEPTH = 3


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    path = tiny_checkpoint("llama", initializer_range=0.1, tie_word_embeddings=True)
    return str(path), hf_model(path)


@pytest.fixture(scope="module")
def engines(tiny):
    """(queued, one step at a time) with prefix caching, chunked prefill (24-token budget) and a
    KV cache tight enough to preempt."""
    common = dict(skip_tokenizer_init=True, max_model_len=64, max_num_batched_tokens=24, max_num_seqs=6,
                  block_size=4, num_gpu_blocks_override=20, async_scheduling=False)
    queued, sync = LLM(tiny[0], **common), LLM(tiny[0], **common)
    queued.engine.batch_queue = BatchQueue(queued.engine, DEPTH)
    yield queued, sync
    queued.shutdown()
    sync.shutdown()


def prompts(seed, lengths, prefix=()):
    rng = random.Random(seed)
    return [list(prefix) + [rng.randrange(3, 300) for _ in range(n)] for n in lengths]


def no_leaks(llm):
    engine = llm.engine
    while engine.has_unfinished_requests():  # a queued step that only drops finished requests
        assert not engine.step().outputs
    manager = engine.kv_cache_manager
    assert not engine.scheduler.requests and not engine.batch_queue
    assert manager.block_pool.get_num_free_blocks() == manager.num_blocks - 1


def drive(engine, requests):
    """Step ``engine`` to the end; checks after every step that no request sits in two queued
    steps. Returns each request's tokens and the most steps seen in flight after a step."""
    for r in requests:
        engine.add_request(r)
    tokens = collections.defaultdict(list)
    peak = 0
    while engine.has_unfinished_requests():
        for out in engine.step().outputs:
            tokens[out.req_id] += out.new_token_ids
        steps = [set(so.num_scheduled_tokens) for so, _ in engine.batch_queue._steps]
        assert sum(map(len, steps)) == len(set().union(*steps)), steps
        peak = max(peak, len(steps))
    return tokens, peak


def test_tokens_and_logprobs_equal_one_step_at_a_time(engines, tiny):
    """Eight requests (a shared 12-token prefix for prefix caching, prompts up to 40 tokens for
    chunked prefill, preemption in the tight cache, a stop token, logprobs): identical tokens,
    finish reasons and logprobs to the one-step engine, and to transformers' greedy tokens."""
    queued, sync = engines
    ps = prompts(1, [5, 28, 2, 17, 40, 9, 3, 21], prefix=prompts(0, [12])[0])
    ref = [hf_greedy(tiny[1], p, 10) for p in ps]
    params = [SamplingParams(max_tokens=1 + 3 * (i % 4), temperature=0, ignore_eos=True, logprobs=2 if i % 3 == 0 else None)
              for i in range(len(ps))]
    params[2] = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, stop_token_ids=[ref[2][4]])
    got = queued.generate([{"prompt_token_ids": p} for p in ps], params)
    want = sync.generate([{"prompt_token_ids": p} for p in ps], params)
    for g, w, r, sp in zip(got, want, ref, params):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        assert g.outputs[0].finish_reason == w.outputs[0].finish_reason
        if sp.stop_token_ids:
            assert g.outputs[0].token_ids == r[: r.index(sp.stop_token_ids[0]) + 1]
        else:
            assert g.outputs[0].token_ids == r[: sp.max_tokens]
        if sp.logprobs:
            for a, b in zip(g.outputs[0].logprobs, w.outputs[0].logprobs):
                assert sorted(a) == sorted(b)
                assert all(abs(a[t].logprob - b[t].logprob) < 1e-4 for t in a)
    assert queued.engine.scheduler.make_stats().prefix_cache_hits > 0
    assert queued.engine.scheduler.num_preemptions > 0
    no_leaks(queued)


def test_queue_fills_never_doubles_a_request_and_survives_aborts(engines, tiny):
    """Driven step by step: the queue reaches its depth, a request is never in two unprocessed
    steps, and a request aborted while its step is in flight ends cleanly."""
    queued, _ = engines
    engine = queued.engine
    ps = prompts(3, [7, 12, 4, 9, 15])
    reqs = [Request(f"q{i}", p, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)) for i, p in enumerate(ps)]
    for r in reqs:
        engine.add_request(r)
    while "q1" not in engine.batch_queue.in_flight:
        engine.step()
    engine.abort_requests(["q1"])
    tokens, peak = drive(engine, [])
    assert "q1" not in engine.scheduler.requests
    no_leaks(queued)
    # and from a clean start, every request's tokens are transformers' greedy ones
    reqs = [Request(f"s{i}", p, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)) for i, p in enumerate(ps)]
    tokens, peak = drive(engine, reqs)
    assert peak == DEPTH - 1  # seen after a step: a full queue has just handed its oldest step back
    assert [tokens[f"s{i}"] for i in range(len(ps))] == [hf_greedy(tiny[1], p, 6) for p in ps]
    no_leaks(queued)


def test_history_dependent_sampling_is_pipelined_exactly(engines):
    """Penalties, min_tokens and seeded sampling read a request's own earlier tokens; a request
    is in one step at a time, so they equal the one-step engine without falling back to it."""
    queued, sync = engines
    ps = prompts(2, [6, 11, 3, 8, 14])
    params = [
        SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, presence_penalty=1.5, frequency_penalty=0.5),
        SamplingParams(max_tokens=10, temperature=0.9, ignore_eos=True, seed=7),
        SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, min_tokens=4, repetition_penalty=1.3),
        SamplingParams(max_tokens=10, temperature=0.8, top_k=20, ignore_eos=True, seed=3),
        SamplingParams(max_tokens=10, temperature=0, ignore_eos=True),
    ]
    got = queued.generate([{"prompt_token_ids": p} for p in ps], params)
    want = sync.generate([{"prompt_token_ids": p} for p in ps], params)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    no_leaks(queued)


def test_scheduler_skips_requests_in_flight(engines):
    """``schedule(in_flight=...)`` leaves those requests out, running or waiting, and the plan
    carries input tokens only when asked to (``send_token_ids``)."""
    queued, _ = engines
    scheduler = queued.engine.scheduler
    for i, p in enumerate(prompts(5, [5, 6])):
        scheduler.add_request(Request(f"k{i}", p, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)))
    so = scheduler.schedule(in_flight={"k1"})
    assert set(so.num_scheduled_tokens) == {"k0"}
    scheduler.send_token_ids = True
    try:
        so2 = scheduler.schedule(in_flight={"k0"})
        assert set(so2.num_scheduled_tokens) == {"k1"} and so2.scheduled_cached_reqs.new_token_ids == []
        scheduler.requests["k0"].append_output_token_ids(77)  # as if its step returned
        scheduler.requests["k0"].num_output_placeholders = 0
        so3 = scheduler.schedule(in_flight={"k1"})
        assert so3.scheduled_cached_reqs.req_ids == ["k0"] and so3.scheduled_cached_reqs.new_token_ids == [[77]]
    finally:
        scheduler.send_token_ids = False
        scheduler.finish_requests(["k0", "k1"], RequestStatus.FINISHED_ABORTED)
        scheduler.finished_req_ids.clear()
