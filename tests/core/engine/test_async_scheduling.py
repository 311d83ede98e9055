"""Asynchronous scheduling: step N+1 is planned and launched before step N's tokens reach the
host (the next step's inputs take them from the device). On CPU the launch runs to completion,
but every piece of the protocol runs: placeholder tokens, the one-step lag of outputs, requests
that end while a step for them is in flight, preemption, aborts, and the switch to one step at a
time while a request's sampling reads its own history. Everything must equal the synchronous
engine token for token (and transformers' greedy tokens)."""

from __future__ import annotations

import random

import pytest
import torch

from helpers import hf_greedy, hf_model
from host import LLM, SamplingParams
from host.contracts.request import Request


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    path = tiny_checkpoint("llama", initializer_range=0.1, tie_word_embeddings=True)
    return str(path), hf_model(path)


def engines(path, **kw):
    common = dict(skip_tokenizer_init=True, max_model_len=64, max_num_batched_tokens=24, max_num_seqs=6, **kw)
    return LLM(path, async_scheduling=True, **common), LLM(path, async_scheduling=False, **common)


def no_leaks(llm):
    manager = llm.engine.kv_cache_manager
    assert not llm.engine.scheduler.requests and llm.engine._in_flight is None
    assert manager.block_pool.get_num_free_blocks() == manager.num_blocks - 1


def prompts(seed, lengths):
    rng = random.Random(seed)
    return [[rng.randrange(3, 300) for _ in range(n)] for n in lengths]


def test_stops_lengths_and_the_context_limit(tiny):
    """Requests end at different steps (max_tokens 1..12, a stop token, the 64-token context):
    each ends exactly where the synchronous engine ends it, although a step for it may already
    be in flight."""
    path, hf = tiny
    fast, slow = engines(path)
    ps = prompts(1, [5, 30, 2, 17, 60, 9])
    ref = [hf_greedy(hf, p, 4) for p in ps]
    params = [
        SamplingParams(max_tokens=1, temperature=0, ignore_eos=True),
        SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),
        SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, stop_token_ids=[ref[2][2]]),
        SamplingParams(max_tokens=2, temperature=0, ignore_eos=True),
        SamplingParams(max_tokens=30, temperature=0, ignore_eos=True),  # 60 + 30 > 64: capped
        SamplingParams(max_tokens=7, temperature=0, ignore_eos=True, logprobs=3),
    ]
    got = fast.generate([{"prompt_token_ids": p} for p in ps], params)
    want = slow.generate([{"prompt_token_ids": p} for p in ps], params)
    for g, w in zip(got, want):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        assert g.outputs[0].finish_reason == w.outputs[0].finish_reason
    stop = ref[2][2]
    assert got[2].outputs[0].token_ids == ref[2][: ref[2].index(stop) + 1] and got[2].outputs[0].finish_reason == "stop"
    assert len(got[4].outputs[0].token_ids) == 4  # 64 - 60
    assert got[0].outputs[0].token_ids == ref[0][:1]
    lp_fast, lp_slow = got[5].outputs[0].logprobs, want[5].outputs[0].logprobs
    assert [sorted(p) for p in lp_fast] == [sorted(p) for p in lp_slow]
    assert fast.engine.executor.worker.model_runner.num_in_flight_tokens > 0
    no_leaks(fast)
    no_leaks(slow)


def test_history_dependent_requests_run_one_step_at_a_time(tiny):
    """Penalties, min_tokens and seeded sampling read the request's own tokens: while such a
    request is in the engine, steps are not overlapped, and results equal the synchronous ones."""
    path, _ = tiny
    fast, slow = engines(path)
    ps = prompts(2, [6, 11, 3, 8])
    params = [
        SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, presence_penalty=1.5, frequency_penalty=0.5),
        SamplingParams(max_tokens=10, temperature=0.9, ignore_eos=True, seed=7),
        SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, min_tokens=4, repetition_penalty=1.3),
        SamplingParams(max_tokens=10, temperature=0, ignore_eos=True),
    ]
    got = fast.generate([{"prompt_token_ids": p} for p in ps], params)
    want = slow.generate([{"prompt_token_ids": p} for p in ps], params)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert fast.engine.executor.worker.model_runner.num_in_flight_tokens == 0
    assert SamplingParams(seed=1, temperature=1.0).needs_history and not SamplingParams(seed=1, temperature=0).needs_history
    no_leaks(fast)


def test_abort_while_a_step_is_in_flight(tiny):
    path, hf = tiny
    llm, _ = engines(path)
    engine = llm.engine
    ps = prompts(3, [7, 12, 4])
    for i, p in enumerate(ps):
        engine.add_request(Request(f"r{i}", p, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)))
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(3)}
    for _ in range(4):
        for out in engine.step().outputs:
            tokens[out.req_id] += out.new_token_ids
    assert engine._in_flight is not None
    engine.abort_requests(["r1"])
    while engine.has_unfinished_requests():
        for out in engine.step().outputs:
            tokens[out.req_id] += out.new_token_ids
    assert tokens["r0"] == hf_greedy(hf, ps[0], 10) and tokens["r2"] == hf_greedy(hf, ps[2], 10)
    assert tokens["r1"] == hf_greedy(hf, ps[1], 10)[: len(tokens["r1"])] and len(tokens["r1"]) < 10
    no_leaks(llm)


def test_random_sampling_and_n(tiny):
    path, _ = tiny
    llm, _ = engines(path, block_size=4, num_gpu_blocks_override=20)  # tight: preemption in the mix
    ps = prompts(4, [9, 14, 21, 5])
    outs = llm.generate([{"prompt_token_ids": p} for p in ps], SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, n=2, ignore_eos=True))
    assert all(len(o.outputs) == 2 and all(len(c.token_ids) == 12 for c in o.outputs) for o in outs)
    assert llm.engine.scheduler.num_preemptions > 0
    no_leaks(llm)


def test_default_follows_the_device():
    from host.core.engine_args import EngineArgs

    assert EngineArgs().async_scheduling is None  # resolved per platform: off on the CPU, on for GPUs


def test_staging_alternates_buffer_sets(monkeypatch):
    """Step N must not overwrite the pinned buffers step N-1's queued copies read from."""
    import numpy as np

    from host.core.worker.host_staging import HostStaging

    stage = HostStaging(torch.device("cpu"))
    stage.pinned = True  # exercise the buffer logic; pinning itself needs an accelerator
    plain_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, pin_memory=False, **kw: plain_empty(*a, **kw))
    stage.next_step()
    a = stage._host("ids", np.arange(5))
    stage.next_step()
    b = stage._host("ids", np.arange(5) + 10)
    stage.next_step()
    c = stage._host("ids", np.arange(5) + 20)
    assert a.data_ptr() != b.data_ptr() and a.data_ptr() == c.data_ptr()
    assert b.tolist() == [10, 11, 12, 13, 14]  # untouched by the step after it
