"""The stat-logger manager: which loggers run, the per-step stats it builds from the output
processor and the scheduler's totals, the finished-request timings, and a failing logger."""

from __future__ import annotations

import logging

import pytest

from host.contracts.messages import (
    EVENT_PREEMPTED,
    EVENT_QUEUED,
    EVENT_SCHEDULED,
    EngineCoreEvent,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    SchedulerStats,
    encoder,
    from_engine_decoder,
)
from host.contracts.sampling_params import SamplingParams
from host.core.frontend.output_processor import OutputProcessor
from host.core.frontend.stat_loggers import StatLoggerManager, finished_stats, parse_stat_logger_specs, select_stat_loggers
from host.sdk import StatLogger
from host.sdk.stat_logger import StatLoggerContext


class Keep(StatLogger):
    name = "keep"

    def __init__(self, context=None, arg=None):
        super().__init__(context, arg)
        self.records = []

    def record(self, scheduler_stats, iteration_stats):
        self.records.append((scheduler_stats, iteration_stats))


class Optional_(StatLogger):
    name = "optional"
    enabled_by_default = False
    argument = "PATH"

    def record(self, scheduler_stats, iteration_stats):
        pass


class Logging(Keep):
    name = "logging"


class Broken(StatLogger):
    name = "broken"

    def record(self, scheduler_stats, iteration_stats):
        raise RuntimeError("sink is down")


REGISTRY = {"keep": Keep, "optional": Optional_, "logging": Logging}


def test_parse_specs_and_selection():
    assert parse_stat_logger_specs(["jsonl:/tmp/a:b.jsonl", "x,y:1", ""]) == {"jsonl": "/tmp/a:b.jsonl", "x": None, "y": "1"}
    assert select_stat_loggers(REGISTRY) == {"keep": None, "logging": None}
    assert select_stat_loggers(REGISTRY, ["optional:/p"]) == {"keep": None, "logging": None, "optional": "/p"}
    assert select_stat_loggers(REGISTRY, [], disable_log_stats=True) == {"keep": None}
    with pytest.raises(ValueError, match="unknown stat logger.*'nope'.*registered: keep, logging, optional"):
        select_stat_loggers(REGISTRY, ["nope:1"])
    with pytest.raises(ValueError, match="no logger name"):
        parse_stat_logger_specs([":x"])


def test_argument_to_a_logger_that_takes_none_is_refused():
    with pytest.raises(ValueError, match="stat logger 'keep' takes no argument, got 'x'"):
        StatLoggerManager.create(REGISTRY, StatLoggerContext(), ["keep:x"])
    with pytest.raises(ValueError, match="log_stats_interval=0"):
        StatLoggerManager([], log_interval=0)


def _request(rid: str, n: int = 1, max_tokens: int = 4) -> EngineCoreRequest:
    return EngineCoreRequest(rid, [1, 2, 3], SamplingParams(n=n, max_tokens=max_tokens, detokenize=False))


def test_step_stats_from_the_output_processor_and_scheduler_totals():
    proc = OutputProcessor(tokenizer=None)
    manager = StatLoggerManager.create(REGISTRY, StatLoggerContext())
    keep = manager.loggers[0]
    proc.add_request(_request("a", n=2, max_tokens=2))
    t0 = 1000.0
    events = [EngineCoreEvent(EVENT_QUEUED, t0), EngineCoreEvent(EVENT_SCHEDULED, t0 + 0.5)]
    done = proc.process_outputs([
        EngineCoreOutput("a-0", [7], events=list(events)),
        EngineCoreOutput("a-1", [8], events=list(events)),
    ])
    manager.on_step(SchedulerStats(num_running_reqs=2, prefix_cache_queries=6, prefix_cache_hits=2, num_preemptions=1), done, in_flight=1)
    _, it = keep.records[-1]
    assert it.num_prompt_tokens == 6  # each sample's prefill of the 3-token prompt
    assert it.num_generation_tokens == 2
    assert len(it.time_to_first_tokens) == 1 and it.inter_token_latencies == []
    assert (it.prefix_cache_queries, it.prefix_cache_hits, it.num_preemptions) == (6, 2, 1)
    assert it.num_requests_in_flight == 1 and it.finished_requests == []

    done = proc.process_outputs([
        EngineCoreOutput("a-0", [9], "length", events=[EngineCoreEvent(EVENT_PREEMPTED, t0 + 1)]),
        EngineCoreOutput("a-1", [9], "length"),
    ])
    manager.on_step(SchedulerStats(prefix_cache_queries=10, prefix_cache_hits=5, num_preemptions=1), done)
    _, it = keep.records[-1]
    # this step's share of the totals, one gap per sample, and the prompt that finished
    assert (it.prefix_cache_queries, it.prefix_cache_hits, it.num_preemptions) == (4, 3, 0)
    assert it.num_prompt_tokens == 0 and it.num_generation_tokens == 2 and len(it.inter_token_latencies) == 2
    [fin] = it.finished_requests
    assert fin.finish_reasons == ["length", "length"] and fin.finish_reason == "length"
    assert (fin.num_prompt_tokens, fin.num_generation_tokens, fin.max_num_generation_tokens) == (3, 4, 2)
    assert (fin.n, fin.max_tokens, fin.num_preemptions) == (2, 2, 1)
    assert fin.queued_time == pytest.approx(0.5)
    assert fin.e2e_latency >= fin.decode_time >= 0


def test_a_prompt_the_front_end_ended_is_reported_once_as_abort():
    proc = OutputProcessor(tokenizer=None)
    manager = StatLoggerManager.create(REGISTRY, StatLoggerContext())
    keep = manager.loggers[0]
    result, _ = proc.add_request(_request("b", max_tokens=8))
    timing = proc.timing("b")
    proc.process_outputs([EngineCoreOutput("b", [5])])
    proc.abort_request("b")
    manager.on_ended(result, timing, SamplingParams(max_tokens=8))
    scheduler_stats, it = keep.records[-1]
    assert scheduler_stats is None
    [fin] = it.finished_requests
    assert fin.finish_reasons == ["abort"] and fin.num_generation_tokens == 1
    assert fin.queued_time == 0.0  # no engine events arrived: the phases stay 0


def test_finished_stats_phases_follow_the_timestamps():
    proc = OutputProcessor(tokenizer=None)
    result, _ = proc.add_request(_request("c", max_tokens=3))
    timing = proc.timing("c")
    timing.arrival, timing.queued, timing.scheduled = 10.0, 10.1, 10.4
    timing.first_token, timing.last_token = 11.0, 12.0
    result.outputs[0].token_ids = [1, 2, 3]
    fin = finished_stats(result, timing, SamplingParams(max_tokens=3), now=12.5)
    assert fin.e2e_latency == pytest.approx(2.5)
    assert fin.queued_time == pytest.approx(0.3)
    assert fin.prefill_time == pytest.approx(0.6)
    assert fin.decode_time == pytest.approx(1.0)
    assert fin.inference_time == pytest.approx(1.6)
    assert fin.mean_time_per_output_token == pytest.approx(0.5)


def test_a_failing_logger_is_logged_once_and_the_others_still_record(caplog):
    manager = StatLoggerManager([Broken(), Keep()])
    with caplog.at_level(logging.ERROR, logger="host.stat_loggers"):
        for _ in range(3):
            manager.on_step(SchedulerStats(), None)
    assert len(manager.loggers[1].records) == 3
    failures = [r for r in caplog.records if "stat logger 'broken' failed in record()" in r.getMessage()]
    assert len(failures) == 1


def test_events_and_deferred_count_survive_the_wire():
    msg = EngineCoreOutputs(
        outputs=[EngineCoreOutput("a", [1], events=[EngineCoreEvent(EVENT_QUEUED, 1.5), EngineCoreEvent(EVENT_SCHEDULED, 2.0)])],
        scheduler_stats=SchedulerStats(num_waiting_reqs=3, num_waiting_deferred=1),
    )
    back = from_engine_decoder.decode(encoder.encode(msg))
    assert back.outputs[0].events == [EngineCoreEvent(EVENT_QUEUED, 1.5), EngineCoreEvent(EVENT_SCHEDULED, 2.0)]
    assert back.scheduler_stats.num_waiting_deferred == 1
    assert from_engine_decoder.decode(encoder.encode(EngineCoreOutputs(outputs=[EngineCoreOutput("b", [2])]))).outputs[0].events is None
