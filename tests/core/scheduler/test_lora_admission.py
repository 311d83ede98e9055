"""The scheduler's ``max_loras`` cap (core/lora/scheduler.py).

A real Scheduler over a real KVCacheManager and real Requests; the model step is a
deterministic function of the tokens so far (as in test_scheduler.py), so each request's tokens
are checked against what it would have produced alone. After every step the running requests use
at most ``max_loras`` distinct adapters.
"""

from __future__ import annotations

import pytest

from host.contracts.lora_request import LoRARequest
from host.contracts.messages import LoRAStats
from host.contracts.request import Request, RequestStatus
from host.contracts.runner_output import ModelRunnerOutput
from host.contracts.sampling_params import SamplingParams
from host.contracts.scheduler_output import SchedulerOutput
from host.core.config import CacheConfig, LoRAConfig, SchedulerConfig
from host.core.kv_cache.manager import KVCacheManager
from host.core.lora.scheduler import LoRAFeature, adapter_key
from host.core.scheduler.scheduler import Scheduler

BS = 4
A = LoRARequest("a", 1, "/adapters/a", "d-a")
B = LoRARequest("b", 2, "/adapters/b", "d-b")
C = LoRARequest("c", 3, "/adapters/c", "d-c")
A_CHANGED = LoRARequest("a", 1, "/adapters/a", "d-a-retrained")  # same name and id, new weights


def next_token(tokens: list[int]) -> int:
    return 10 + (sum(tokens[-3:]) * 31 + len(tokens)) % 997


def make_scheduler(max_loras: int | None, max_num_seqs: int = 16, caching: bool = True) -> Scheduler:
    sc = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=64, max_model_len=64, enable_chunked_prefill=True)
    cc = CacheConfig(block_size=BS, enable_prefix_caching=caching)
    m = KVCacheManager(num_blocks=64, block_size=BS, enable_caching=caching, max_model_len=64)
    lora = LoRAConfig(max_loras=max_loras) if max_loras is not None else None
    return Scheduler(sc, cc, m, lora_config=lora)


_arrival = iter(range(10**9))


def req(req_id: str, lora: LoRARequest | None, max_tokens: int = 3, prompt_len: int = 6) -> Request:
    prompt = [100 + (i * 7 + sum(map(ord, req_id))) % 900 for i in range(prompt_len)]
    return Request(req_id, prompt, SamplingParams(max_tokens=max_tokens), eos_token_id=2,
                   arrival_time=float(next(_arrival)), lora_request=lora)


def step(sched: Scheduler) -> SchedulerOutput:
    """One step: the fake model samples for every request whose scheduled tokens reach its end."""
    so = sched.schedule()
    req_ids = list(so.num_scheduled_tokens)
    sampled = [[next_token(sched.requests[r].all_token_ids)] if r in so.sampling_req_ids else [] for r in req_ids]
    sched.update_from_output(so, ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, sampled))
    return so


def run(sched: Scheduler, max_loras: int | None, requests: list[Request]) -> list[list[str]]:
    """Run to the end; returns each step's newly admitted request ids. Checks the cap after every
    step, each request's tokens against running alone, and that no block leaked."""
    for r in requests:
        sched.add_request(r)
    admitted: list[list[str]] = []
    for _ in range(200):
        if not sched.has_unfinished_requests():
            break
        so = step(sched)
        admitted.append([n.req_id for n in so.scheduled_new_reqs])
        in_use = {adapter_key(r) for r in sched.running} - {None}
        assert max_loras is None or len(in_use) <= max_loras, f"running {sorted(in_use)} > max_loras={max_loras}"
    assert not sched.has_unfinished_requests()
    for r in requests:
        assert r.status == RequestStatus.FINISHED_LENGTH_CAPPED, r  # finished, none failed
        alone = list(r.prompt_token_ids)
        for _ in range(r.max_tokens):
            alone.append(next_token(alone))
        assert r.output_token_ids == alone[r.num_prompt_tokens:]
    pool = sched.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_blocks - 1, "KV blocks leaked"
    return admitted


def test_a_second_adapter_waits_while_max_loras_are_running():
    sched = make_scheduler(max_loras=1)
    a1, b1, a2, base = req("a1", A, max_tokens=4), req("b1", B), req("a2", A), req("base", None)
    admitted = run(sched, 1, [a1, b1, a2, base])
    # step 1: b1 waits; a2 (the running adapter) and the base request go past it
    assert admitted[0] == ["a1", "a2", "base"]
    # b1 runs as soon as the last request of adapter a has finished
    first_b = next(i for i, ids in enumerate(admitted) if "b1" in ids)
    assert a1.status.is_finished and first_b == 4  # a1's 4 tokens take steps 0-3


def test_the_stats_name_the_running_and_the_waiting_adapters():
    sched = make_scheduler(max_loras=1)
    for r in (req("a1", A), req("b1", B), req("a2", A), req("base", None)):
        sched.add_request(r)
    assert sched.make_stats().lora_stats == LoRAStats(max_lora=1, running={}, waiting={"a": 2, "b": 1})
    step(sched)
    assert sched.make_stats().lora_stats == LoRAStats(max_lora=1, running={"a": 2}, waiting={"b": 1})
    run(sched, 1, [])
    assert sched.make_stats().lora_stats == LoRAStats(max_lora=1, running={}, waiting={})
    assert make_scheduler(max_loras=None).make_stats().lora_stats is None


def test_the_waiting_request_keeps_its_place_in_the_queue():
    sched = make_scheduler(max_loras=2)
    rs = [req("a1", A, max_tokens=2), req("b1", B, max_tokens=6), req("c1", C), req("c2", C), req("a2", A, prompt_len=9)]
    for r in rs:
        sched.add_request(r)
    step(sched)
    # c1 and c2 wait (a third adapter), a2 runs with the running adapter a
    assert [r.request_id for r in sched.running] == ["a1", "b1", "a2"]
    assert [r.request_id for r in sched.waiting] == ["c1", "c2"]
    assert all(r.status == RequestStatus.WAITING for r in sched.waiting)
    admitted = run(sched, 2, [])
    assert [i for ids in admitted for i in ids] == ["c1", "c2"]  # in order, once a and then b free a slot
    for r in rs:
        assert r.status.is_finished


def test_base_model_requests_are_never_held_back():
    sched = make_scheduler(max_loras=1, max_num_seqs=4)
    rs = [req("a1", A, max_tokens=5), req("b1", B), req("b2", B), req("base1", None), req("base2", None)]
    admitted = run(sched, 1, rs)
    assert admitted[0] == ["a1", "base1", "base2"]


def test_a_changed_adapter_under_the_same_id_is_another_adapter():
    sched = make_scheduler(max_loras=1)
    old, new = req("old", A, max_tokens=3), req("new", A_CHANGED)
    admitted = run(sched, 1, [old, new])
    assert admitted[0] == ["old"] and "new" in admitted[3]


def test_without_lora_config_nothing_is_capped_and_max_loras_n_runs_n():
    admitted = run(make_scheduler(max_loras=3), 3, [req("a", A), req("b", B), req("c", C)])
    assert admitted[0] == ["a", "b", "c"]
    assert make_scheduler(max_loras=None).feature("lora") is None


def test_a_preempted_request_is_readmitted_under_the_cap():
    # a KV cache too small for everyone: running requests are preempted and come back through
    # admission, which still holds the cap
    sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64, enable_chunked_prefill=True)
    m = KVCacheManager(num_blocks=9, block_size=BS, enable_caching=True, max_model_len=64)
    sched = Scheduler(sc, CacheConfig(block_size=BS, enable_prefix_caching=True), m, lora_config=LoRAConfig(max_loras=2))
    rs = [req(f"{name}{i}", lora, max_tokens=10) for i in range(2) for name, lora in (("a", A), ("b", B), ("c", C))]
    run(sched, 2, rs)
    assert sched.num_preemptions > 0


def test_admission_rejects_a_bad_max_loras():
    with pytest.raises(ValueError, match="max_loras=0"):
        LoRAFeature(0)
