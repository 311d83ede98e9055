"""Scheduler unit tests, driven by a fake model step that produces deterministic tokens.

The fake runner keeps its own persistent batch, built only from what the scheduler sends
(``SchedulerOutput``), and checks it on every step: the block table covers the scheduled tokens,
``num_computed_tokens`` agrees, resumed requests come back with their output tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from host.contracts.request import Request, RequestStatus
from host.contracts.runner_output import ModelRunnerOutput
from host.contracts.sampling_params import SamplingParams
from host.contracts.scheduler_output import SchedulerOutput
from host.core.config import CacheConfig, SchedulerConfig
from host.core.kv_cache.manager import KVCacheManager
from host.core.scheduler.policy import FCFSRequestQueue, PriorityRequestQueue, create_request_queue
from host.core.scheduler.scheduler import Scheduler

EOS = 2


def next_token(tokens: list[int]) -> int:
    """The fake model: a deterministic function of the whole sequence so far (never EOS)."""
    return 10 + (sum(tokens[-3:]) * 31 + len(tokens)) % 997


@dataclass
class _RunnerState:
    tokens: list[int]
    num_prompt: int
    block_ids: list[int]
    computed: int


@dataclass
class FakeRunner:
    block_size: int
    script: dict[str, list[int]] = field(default_factory=dict)  # req_id -> tokens by output index
    reqs: dict[str, _RunnerState] = field(default_factory=dict)

    def step(self, so: SchedulerOutput) -> ModelRunnerOutput:
        for req_id in so.finished_req_ids | so.preempted_req_ids:
            self.reqs.pop(req_id, None)
        for new in so.scheduled_new_reqs:
            assert new.req_id not in self.reqs
            self.reqs[new.req_id] = _RunnerState(
                tokens=list(new.prompt_token_ids) + list(new.output_token_ids),
                num_prompt=len(new.prompt_token_ids),
                block_ids=list(new.block_ids),
                computed=new.num_computed_tokens,
            )
        cached = so.scheduled_cached_reqs
        for req_id, new_ids, computed in zip(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens):
            state = self.reqs[req_id]
            assert state.computed == computed
            state.block_ids.extend(new_ids)
        assert so.total_num_scheduled_tokens == sum(so.num_scheduled_tokens.values())
        req_ids, sampled = [], []
        for req_id, n in so.num_scheduled_tokens.items():
            state = self.reqs[req_id]
            assert 0 < n and state.computed + n <= len(state.tokens)
            assert len(state.block_ids) * self.block_size >= state.computed + n
            assert 0 not in state.block_ids  # the null block is never handed out
            state.computed += n
            out: list[int] = []
            if state.computed == len(state.tokens):
                idx = len(state.tokens) - state.num_prompt
                script = self.script.get(req_id, [])
                tok = script[idx] if idx < len(script) else next_token(state.tokens)
                state.tokens.append(tok)
                out = [tok]
            req_ids.append(req_id)
            sampled.append(out)
        return ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, sampled)


@dataclass
class Result:
    tokens: dict[str, list[int]] = field(default_factory=dict)
    finish: dict[str, str] = field(default_factory=dict)
    steps: list[SchedulerOutput] = field(default_factory=list)


def step(sched: Scheduler, runner: FakeRunner, result: Result | None = None) -> SchedulerOutput:
    so = sched.schedule()
    out = sched.update_from_output(so, runner.step(so))
    if result is not None:
        result.steps.append(so)
        for o in out.outputs:
            result.tokens.setdefault(o.req_id, []).extend(o.new_token_ids)
            if o.finished:
                result.finish[o.req_id] = o.finish_reason
    return so


def run(sched: Scheduler, runner: FakeRunner, max_steps: int = 2000) -> Result:
    result = Result()
    for _ in range(max_steps):
        if not sched.has_unfinished_requests():
            break
        step(sched, runner, result)
    assert not sched.has_unfinished_requests(), "requests did not finish"
    return result


_managers: list[KVCacheManager] = []


@pytest.fixture(autouse=True)
def no_leaks():
    """After every test, every scheduler's KV cache is completely free again."""
    _managers.clear()
    yield
    for m in _managers:
        pool = m.block_pool
        assert pool.get_num_free_blocks() == pool.num_blocks - 1, "KV blocks leaked"
        assert all(b.ref_cnt == 0 for b in pool.blocks)
        assert not m.req_to_blocks


def make_scheduler(
    num_blocks: int = 64,
    block_size: int = 4,
    max_num_batched_tokens: int = 64,
    max_num_seqs: int = 16,
    max_model_len: int = 64,
    chunked: bool = True,
    policy: str = "fcfs",
    threshold: int = 0,
    caching: bool = True,
) -> Scheduler:
    sc = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=threshold,
        policy=policy,
    )
    cc = CacheConfig(block_size=block_size, enable_prefix_caching=caching)
    m = KVCacheManager(num_blocks=num_blocks, block_size=block_size, enable_caching=caching, max_model_len=max_model_len)
    _managers.append(m)
    return Scheduler(sc, cc, m)


_clock = iter(range(10**9))


def req(
    req_id: str,
    prompt: list[int] | int,
    max_tokens: int | None = 8,
    priority: int = 0,
    **sp,
) -> Request:
    if isinstance(prompt, int):
        seed = sum(map(ord, req_id)) * 13  # distinct prompts for distinct ids
        prompt = [100 + (i * 7 + seed) % 900 for i in range(prompt)]
    return Request(
        req_id,
        prompt,
        SamplingParams(max_tokens=max_tokens, **sp),
        eos_token_id=EOS,
        arrival_time=float(next(_clock)),
        priority=priority,
    )


def reference_outputs(prompt: list[int], n: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(next_token(tokens))
    return tokens[len(prompt) :]


# -- SamplingParams / Request ---------------------------------------------------------------------


def test_sampling_params_validation():
    sp = SamplingParams()
    assert (sp.n, sp.max_tokens, sp.top_k, sp.stop, sp.stop_token_ids) == (1, 16, 0, [], [])
    assert SamplingParams(temperature=0.0).is_greedy and not sp.is_greedy
    assert SamplingParams(top_k=-1).top_k == 0
    assert SamplingParams(stop="###").stop == ["###"]
    for kwargs, field_name in [
        ({"n": 0}, "n="),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"logprobs": -2}, "logprobs"),
    ]:
        with pytest.raises(ValueError, match=field_name):
            SamplingParams(**kwargs)


def test_request_status_and_token_lists():
    assert not RequestStatus.PREEMPTED.is_finished and RequestStatus.FINISHED_ABORTED.is_finished
    assert RequestStatus.FINISHED_STOPPED.finish_reason == "stop"
    assert RequestStatus.FINISHED_LENGTH_CAPPED.finish_reason == "length"
    assert RequestStatus.FINISHED_ABORTED.finish_reason == "abort"
    assert RequestStatus.RUNNING.finish_reason is None
    r = Request("r", [1, 2, 3], SamplingParams(max_tokens=4))
    assert r.status == RequestStatus.WAITING and r.num_cached_tokens == -1
    r.append_output_token_ids([4, 5])
    r.append_output_token_ids(6)
    assert r.all_token_ids == [1, 2, 3, 4, 5, 6] and r.output_token_ids == [4, 5, 6]
    assert (r.num_tokens, r.num_prompt_tokens, r.num_output_tokens, r.max_tokens) == (6, 3, 3, 4)
    assert r.block_hashes == []  # no hasher: nothing hashed


# -- basics ----------------------------------------------------------------------------------------


def test_single_request_runs_to_max_tokens():
    sched = make_scheduler()
    runner = FakeRunner(4)
    r = req("a", 10, max_tokens=5)
    sched.add_request(r)
    res = run(sched, runner)
    assert res.tokens["a"] == reference_outputs(r.prompt_token_ids, 5)
    assert res.finish["a"] == "length"
    assert len(res.steps) == 5
    assert res.steps[0].num_scheduled_tokens == {"a": 10}
    assert all(s.num_scheduled_tokens == {"a": 1} for s in res.steps[1:])
    # the finished id reaches the runner with the next schedule
    assert sched.schedule().finished_req_ids == {"a"}
    assert sched.get_num_unfinished_requests() == 0


def test_stop_conditions_eos_min_tokens_stop_ids_and_max_model_len():
    sched = make_scheduler()
    runner = FakeRunner(4, script={"eos": [50, EOS], "min": [EOS, 51, EOS, 52], "noeos": [EOS, EOS, EOS],
                                   "stopid": [60, 61, 77]})
    sched.add_request(req("eos", 6, max_tokens=10))
    sched.add_request(req("min", 6, max_tokens=10, min_tokens=2))
    sched.add_request(req("noeos", 6, max_tokens=3, ignore_eos=True))
    sched.add_request(req("stopid", 6, max_tokens=10, stop_token_ids=[77]))
    sched.add_request(req("mml", 60, max_tokens=None))  # max_model_len=64
    res = run(sched, runner)
    assert res.tokens["eos"] == [50, EOS] and res.finish["eos"] == "stop"
    # EOS as 1st output is ignored (min_tokens=2); as 3rd output it stops
    assert res.tokens["min"] == [EOS, 51, EOS] and res.finish["min"] == "stop"
    assert res.tokens["noeos"] == [EOS, EOS, EOS] and res.finish["noeos"] == "length"
    assert res.tokens["stopid"] == [60, 61, 77] and res.finish["stopid"] == "stop"
    assert len(res.tokens["mml"]) == 4 and res.finish["mml"] == "length"


def test_stop_reason_is_reported():
    sched = make_scheduler()
    runner = FakeRunner(4, script={"s": [77]})
    sched.add_request(req("s", 4, stop_token_ids=[77]))
    so = sched.schedule()
    out = sched.update_from_output(so, runner.step(so))
    (o,) = out.outputs
    assert (o.finish_reason, o.stop_reason, o.new_token_ids) == ("stop", 77, [77])
    assert out.scheduler_stats.num_running_reqs == 0


def test_add_request_validation():
    sched = make_scheduler(num_blocks=8, max_model_len=40)
    with pytest.raises(ValueError, match="max_model_len=40"):
        sched.add_request(req("long", 41))
    with pytest.raises(ValueError, match="empty prompt"):
        sched.add_request(req("empty", []))
    with pytest.raises(ValueError, match="--kv-cache-memory"):
        sched.add_request(req("huge", 29))  # 8 blocks of 4 > 7 usable
    sched.add_request(req("ok", 8))
    with pytest.raises(ValueError, match="already in use"):
        sched.add_request(req("ok", 8))
    run(sched, FakeRunner(4))
    with pytest.raises(ValueError, match="--max-num-batched-tokens"):
        make_scheduler(max_num_batched_tokens=32, max_model_len=64, chunked=False)


def test_max_num_seqs_caps_running_requests():
    sched = make_scheduler(max_num_seqs=2)
    for i in range(5):
        sched.add_request(req(f"r{i}", 5, max_tokens=3))
    res = run(sched, FakeRunner(4))
    assert all(len(s.num_scheduled_tokens) <= 2 for s in res.steps)
    assert [n.req_id for s in res.steps for n in s.scheduled_new_reqs] == ["r0", "r1", "r2", "r3", "r4"]
    assert set(res.finish) == {f"r{i}" for i in range(5)}


# -- chunked prefill ------------------------------------------------------------------------------


def test_chunked_prefill_splits_a_long_prompt_while_a_decode_runs_every_step():
    sched = make_scheduler(num_blocks=64, max_num_batched_tokens=16, max_model_len=128)
    runner = FakeRunner(4)
    d = req("decode", 4, max_tokens=20)
    sched.add_request(d)
    res = Result()
    step(sched, runner, res)  # the short prompt's prefill
    long_req = req("long", 100, max_tokens=2)
    sched.add_request(long_req)
    chunks = []
    while "long" not in res.tokens:
        so = step(sched, runner, res)
        assert so.num_scheduled_tokens["decode"] == 1  # never starved
        assert so.total_num_scheduled_tokens <= 16
        chunks.append(so.num_scheduled_tokens["long"])
    assert chunks == [15] * 6 + [10]
    assert sum(chunks) == 100
    # mid-prefill steps sample nothing for the long request
    assert len(res.tokens["long"]) == 1
    while sched.has_unfinished_requests():
        step(sched, runner, res)
    assert res.tokens["long"] == reference_outputs(long_req.prompt_token_ids, 2)
    assert res.tokens["decode"] == reference_outputs(d.prompt_token_ids, 20)


def test_long_prefill_threshold_caps_each_chunk_and_leaves_room_for_others():
    sched = make_scheduler(max_num_batched_tokens=32, max_model_len=128, threshold=8)
    runner = FakeRunner(4)
    sched.add_request(req("a", 40, max_tokens=1))
    sched.add_request(req("b", 40, max_tokens=1))
    so = step(sched, runner)
    assert so.num_scheduled_tokens == {"a": 8, "b": 8}
    run(sched, runner)
    # a single request is not capped (nobody to starve)
    sched.add_request(req("solo", 40, max_tokens=1))
    assert step(sched, runner).num_scheduled_tokens == {"solo": 32}
    run(sched, runner)


def test_a_prefill_chunk_leaves_a_token_for_decodes_behind_it():
    # chunked prefill of "p" is resumed ahead of the decode "d" in the running list
    sched = make_scheduler(max_num_batched_tokens=16, max_model_len=128, threshold=6)
    runner = FakeRunner(4)
    sched.add_request(req("p", 40, max_tokens=1))
    sched.add_request(req("d", 3, max_tokens=30))
    first = step(sched, runner)
    assert first.num_scheduled_tokens == {"p": 6, "d": 3}
    sched.scheduler_config.long_prefill_token_threshold = 0  # p now wants the whole budget
    so = step(sched, runner)
    assert so.num_scheduled_tokens == {"p": 15, "d": 1}
    run(sched, runner)


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_budget():
    sched = make_scheduler(max_num_batched_tokens=64, max_model_len=64, chunked=False)
    runner = FakeRunner(4)
    sched.add_request(req("a", 40, max_tokens=3))
    sched.add_request(req("b", 40, max_tokens=3))
    so = step(sched, runner)
    assert so.num_scheduled_tokens == {"a": 40}  # b does not fit in the 24 left, is not split
    so = step(sched, runner)
    assert so.num_scheduled_tokens == {"a": 1, "b": 40}
    run(sched, runner)


# -- prefix caching ---------------------------------------------------------------------------------


def test_shared_64_token_prefix_is_computed_once():
    sched = make_scheduler(num_blocks=128, block_size=16, max_num_batched_tokens=512, max_model_len=256)
    runner = FakeRunner(16)
    prefix = list(range(1000, 1064))
    sched.add_request(req("a", prefix + [1, 2, 3, 4, 5], max_tokens=4))
    sched.add_request(req("b", prefix + [6, 7, 8], max_tokens=4))
    so = step(sched, runner)
    # b's 64 prefix tokens are found in the cache in the same step a computes them
    assert so.num_scheduled_tokens == {"a": 69, "b": 3}
    new = {n.req_id: n for n in so.scheduled_new_reqs}
    assert new["b"].num_computed_tokens == 64
    assert new["b"].block_ids[:4] == new["a"].block_ids[:4]
    run(sched, runner)
    sched.add_request(req("c", prefix + [9], max_tokens=2))
    so = step(sched, runner)
    assert so.num_scheduled_tokens == {"c": 1}
    run(sched, runner)
    stats = sched.make_stats()
    assert stats.prefix_cache_queries == 69 + 67 + 65
    assert stats.prefix_cache_hits == 128
    assert stats.prefix_cache_hit_rate == pytest.approx(128 / 201)
    assert stats.kv_cache_usage == 0.0


def test_fully_cached_prompt_recomputes_its_last_block_and_reports_cached_tokens():
    sched = make_scheduler(block_size=4)
    runner = FakeRunner(4)
    prompt = list(range(300, 316))  # exactly 4 blocks
    sched.add_request(req("a", prompt, max_tokens=2))
    run(sched, runner)
    sched.add_request(req("b", prompt, max_tokens=2))
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"b": 4}  # 3 blocks hit, the last one recomputed
    out = sched.update_from_output(so, runner.step(so))
    assert out.outputs[0].num_cached_tokens == 12
    res = run(sched, runner)
    assert res.tokens["b"][-1:] == reference_outputs(prompt, 2)[-1:]


def test_prefix_caching_disabled_computes_everything():
    sched = make_scheduler(caching=False)
    runner = FakeRunner(4)
    prompt = list(range(300, 316))
    sched.add_request(req("a", prompt + [1], max_tokens=1))
    run(sched, runner)
    sched.add_request(req("b", prompt + [1], max_tokens=1))
    assert step(sched, runner).num_scheduled_tokens == {"b": 17}
    assert sched.make_stats().prefix_cache_queries == 0


# -- preemption -------------------------------------------------------------------------------------


def test_preemption_when_blocks_run_out_then_resume_and_complete():
    # 8 usable blocks of 4 tokens; two requests that each grow to 12 + 20 = 32 tokens (8 blocks)
    sched = make_scheduler(num_blocks=9, block_size=4, max_model_len=64)
    runner = FakeRunner(4)
    a = req("a", 12, max_tokens=20)
    b = req("b", 12, max_tokens=20)
    sched.add_request(a)
    sched.add_request(b)
    res = Result()
    preempt_step = None
    for i in range(500):
        if not sched.has_unfinished_requests():
            break
        so = step(sched, runner, res)
        if so.preempted_req_ids and preempt_step is None:
            preempt_step = i
            # FCFS: the request admitted last is the victim; it goes back to the waiting front
            assert so.preempted_req_ids == {"b"}
            assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0
            assert sched.waiting.peek_request() is b
            assert "b" not in so.num_scheduled_tokens
            assert not so.scheduled_new_reqs  # no admissions in a step that preempted
            assert sched.kv_cache_manager.get_block_ids("b") == []
    assert preempt_step is not None
    resumed = [n for s in res.steps[preempt_step + 1 :] for n in s.scheduled_new_reqs if n.req_id == "b"]
    assert resumed and resumed[0].output_token_ids == res.tokens["b"][: len(resumed[0].output_token_ids)]
    assert len(resumed[0].output_token_ids) > 0
    # recompute preemption is invisible in the outputs
    assert res.tokens["a"] == reference_outputs(a.prompt_token_ids, 20)
    assert res.tokens["b"] == reference_outputs(b.prompt_token_ids, 20)
    assert res.finish == {"a": "length", "b": "length"}
    assert b.num_preemptions >= 1 and sched.make_stats().num_preemptions >= 1


def test_priority_preemption_refunds_the_budget_of_a_victim_scheduled_earlier_in_the_step():
    # running order [low, high, mid]. In the critical step low (priority 10) is served first,
    # then high runs out of blocks and low, the lowest priority, is preempted after it was
    # scheduled: its token goes back to the budget, and mid's prefill chunk gets it.
    sched = make_scheduler(num_blocks=6, block_size=4, max_num_batched_tokens=8, max_model_len=64,
                           policy="priority")
    cfg = sched.scheduler_config
    runner = FakeRunner(4)
    low = req("low", 4, max_tokens=10, priority=10)
    sched.add_request(low)
    assert step(sched, runner).num_scheduled_tokens == {"low": 4}  # low: 1 block
    high = req("high", 10, max_tokens=2, priority=0)
    sched.add_request(high)
    assert step(sched, runner).num_scheduled_tokens == {"low": 1, "high": 7}  # 2 + 2 blocks
    mid = req("mid", 20, max_tokens=1, priority=5)
    sched.add_request(mid)
    cfg.long_prefill_token_threshold = 1
    assert step(sched, runner).num_scheduled_tokens == {"low": 1, "high": 1, "mid": 1}
    assert [r.request_id for r in sched.running] == ["low", "high", "mid"]
    assert sched.kv_cache_manager.num_free_blocks == 0  # low 2, high 2, mid 1 blocks
    cfg.long_prefill_token_threshold = 0
    # low's decode fits its blocks (scheduled: budget 7 left); high's last 2 prompt tokens need
    # a 3rd block -> low is preempted and refunded (budget 8 again) -> high 2, mid 6
    so = step(sched, runner)
    assert so.preempted_req_ids == {"low"}
    assert "low" not in so.num_scheduled_tokens and "low" not in so.scheduled_cached_reqs.req_ids
    assert so.num_scheduled_tokens == {"high": 2, "mid": 6}  # without the refund: mid 5
    assert so.total_num_scheduled_tokens == 8
    assert low.status == RequestStatus.PREEMPTED and low.num_computed_tokens == 0
    res = run(sched, runner)
    assert res.finish == {"low": "length", "high": "length", "mid": "length"}
    assert low.output_token_ids == reference_outputs(low.prompt_token_ids, 10)
    assert any(n.req_id == "low" and n.output_token_ids for s in res.steps for n in s.scheduled_new_reqs)


def test_fcfs_victim_is_the_tail_of_the_running_list():
    sched = make_scheduler(num_blocks=5, block_size=4, max_model_len=64)  # 4 usable
    runner = FakeRunner(4)
    sched.add_request(req("a", 8, max_tokens=8))
    sched.add_request(req("b", 7, max_tokens=8))
    step(sched, runner)  # a 2 blocks, b 2 blocks; a's decode now needs a 3rd block
    so = step(sched, runner)
    assert so.preempted_req_ids == {"b"} and so.num_scheduled_tokens == {"a": 1}
    res = run(sched, runner)
    assert res.finish == {"a": "length", "b": "length"}


def test_a_request_that_is_its_own_victim_is_preempted_and_the_loop_stops():
    sched = make_scheduler(num_blocks=5, block_size=4, max_model_len=64)  # 4 usable
    runner = FakeRunner(4)
    b = req("b", 8, max_tokens=8)
    sched.add_request(req("a", 7, max_tokens=8))
    sched.add_request(b)
    step(sched, runner)  # a 2 blocks (room for 1 more token), b 2 full blocks
    so = step(sched, runner)
    # a fits; b (the tail) needs a block, is its own victim: preempted, nothing more this step
    assert so.num_scheduled_tokens == {"a": 1} and so.preempted_req_ids == {"b"}
    assert sched.waiting.peek_request().request_id == "b"
    assert [r.request_id for r in sched.running] == ["a"]
    res = run(sched, runner)
    assert res.finish == {"a": "length", "b": "length"}
    assert res.tokens["b"] == reference_outputs(b.prompt_token_ids, 8)[1:]  # 1st came in step 1


def test_a_request_larger_than_the_whole_cache_is_length_capped_not_stuck():
    sched = make_scheduler(num_blocks=4, block_size=4, max_model_len=64)  # 3 usable = 12 tokens
    runner = FakeRunner(4)
    sched.add_request(req("a", 8, max_tokens=20))
    res = run(sched, runner)
    # 12 slots: the token sampled after the 12th one is still delivered, then it is capped
    assert res.finish == {"a": "length"} and len(res.tokens["a"]) == 5


# -- ordering and aborts -------------------------------------------------------------------------


def test_fcfs_vs_priority_admission_order():
    def order(policy: str) -> list[str]:
        sched = make_scheduler(max_num_seqs=1, policy=policy)
        for name, prio in [("a", 5), ("b", 0), ("c", 5), ("d", -1)]:
            sched.add_request(req(name, 4, max_tokens=2, priority=prio))
        res = run(sched, FakeRunner(4))
        return [n.req_id for s in res.steps for n in s.scheduled_new_reqs]

    assert order("fcfs") == ["a", "b", "c", "d"]
    assert order("priority") == ["d", "b", "a", "c"]


def test_policy_queues_and_victims():
    rs = [req(n, 2, priority=p) for n, p in [("x", 1), ("y", 3), ("z", 3)]]
    fcfs = create_request_queue("fcfs")
    prio = create_request_queue("priority")
    assert isinstance(fcfs, FCFSRequestQueue) and isinstance(prio, PriorityRequestQueue)
    for r in rs:
        fcfs.add_request(r)
        prio.add_request(r)
    fcfs.remove_requests([rs[2]])
    fcfs.prepend_request(rs[2])
    assert [r.request_id for r in fcfs] == ["z", "x", "y"] and fcfs.pop_request() is rs[2]
    assert [r.request_id for r in prio] == ["x", "y", "z"]
    prio.remove_requests([rs[1]])
    assert [r.request_id for r in prio] == ["x", "z"] and len(prio) == 2
    assert fcfs.select_victim(rs) is rs[2]
    assert prio.select_victim(rs) is rs[2]  # highest value, latest arrival
    assert prio.select_victim([rs[2], rs[1], rs[0]]) is rs[2]
    with pytest.raises(ValueError, match="policy"):
        create_request_queue("lifo")


def test_abort_frees_blocks_immediately():
    sched = make_scheduler(num_blocks=32)
    runner = FakeRunner(4)
    sched.add_request(req("a", 20, max_tokens=10))
    sched.add_request(req("w", 20, max_tokens=10))
    sched.max_num_running_reqs = 1  # keep w waiting
    step(sched, runner)
    kv = sched.kv_cache_manager
    assert kv.get_block_ids("a") and kv.usage > 0
    sched.finish_requests(["a", "w", "unknown"], RequestStatus.FINISHED_ABORTED)
    assert kv.num_free_blocks == kv.num_blocks - 1 and kv.usage == 0.0
    assert not sched.has_unfinished_requests() and len(sched.waiting) == 0
    so = sched.schedule()
    assert so.finished_req_ids == {"a", "w"} and so.is_empty
    with pytest.raises(ValueError):
        sched.finish_requests("a", RequestStatus.RUNNING)


def test_abort_between_schedule_and_update_drops_the_sample():
    sched = make_scheduler()
    runner = FakeRunner(4)
    sched.add_request(req("a", 5, max_tokens=5))
    so = sched.schedule()
    sched.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    out = sched.update_from_output(so, runner.step(so))
    assert out.outputs == []
    assert sched.schedule().finished_req_ids == {"a"}
