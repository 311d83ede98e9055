"""The feature seam (core/scheduler/feature.py): a feature the scheduler has never heard of plugs
in through ``Scheduler(features=...)`` and changes admission, contributes tokens, fails a request
from its tokens and hears of every request that leaves; and the scheduler itself names no feature."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

from helpers import REPO
from host.contracts.request import RequestStatus
from host.core.config import CacheConfig, SchedulerConfig
from host.core.kv_cache.manager import KVCacheManager
from host.core.scheduler.builtin_features import default_features
from host.core.scheduler.feature import WAIT, SchedulerFeature
from host.core.scheduler.scheduler import Scheduler

_spec = importlib.util.spec_from_file_location("_sched_tests", Path(__file__).with_name("test_scheduler.py"))
_sched_tests = importlib.util.module_from_spec(_spec)
sys.modules["_sched_tests"] = _sched_tests
_spec.loader.exec_module(_sched_tests)
FakeRunner, reference_outputs, req, run = _sched_tests.FakeRunner, _sched_tests.reference_outputs, _sched_tests.req, _sched_tests.run


class OneAtATime(SchedulerFeature):
    """Admits a waiting request only while nobody runs; fails a request whose token is in ``poison``."""

    name = "one_at_a_time"

    def __init__(self, poison: int | None = None) -> None:
        self.poison = poison
        self.running_now: list[str] = []
        self.admitted_ids: list[str] = []
        self.finished_ids: list[tuple[str, RequestStatus]] = []
        self.max_running_seen = 0

    def begin_admissions(self, running):
        self.running_now = [r.request_id for r in running]

    def admit(self, request):
        return WAIT if self.running_now else None

    def admitted(self, request):
        self.running_now.append(request.request_id)
        self.admitted_ids.append(request.request_id)

    def take_tokens(self, request, new_token_ids, num_sampled, index, scheduler_output, runner_output):
        self.max_running_seen = max(self.max_running_seen, len(scheduler_output.num_scheduled_tokens))
        if self.poison in new_token_ids:
            return f"token {self.poison} is poisoned"
        return None

    def finished(self, request, was):
        self.finished_ids.append((request.request_id, was))


def _scheduler(features) -> tuple[Scheduler, KVCacheManager]:
    kv = KVCacheManager(num_blocks=64, block_size=4, enable_caching=True, max_model_len=64)
    sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64)
    return Scheduler(sc, CacheConfig(block_size=4, enable_prefix_caching=True), kv, features=features), kv


def test_a_new_feature_holds_requests_back_in_their_place():
    feature = OneAtATime()
    sched, kv = _scheduler([*default_features(None, 64), feature])
    runner = FakeRunner(block_size=4)
    reqs = [req(f"r{i}", 6, max_tokens=3) for i in range(3)]
    for r in reqs:
        sched.add_request(r)
    result = run(sched, runner)
    assert feature.max_running_seen == 1  # the feature's admission held the others back
    assert feature.admitted_ids == ["r0", "r1", "r2"]  # in their place, in order
    assert [f[0] for f in feature.finished_ids] == ["r0", "r1", "r2"]
    assert all(was == RequestStatus.RUNNING for _, was in feature.finished_ids)
    for r in reqs:
        assert result.tokens[r.request_id] == reference_outputs(r.prompt_token_ids, 3)
    assert kv.block_pool.get_num_free_blocks() == kv.block_pool.num_blocks - 1
    assert sched.feature("one_at_a_time") is feature and sched.feature("spec_decode") is None


def test_a_feature_fails_a_request_from_its_tokens_and_the_blocks_come_back():
    r = req("bad", 5, max_tokens=6)
    poison = reference_outputs(r.prompt_token_ids, 2)[1]
    feature = OneAtATime(poison=poison)
    sched, kv = _scheduler([*default_features(None, 64), feature])
    sched.add_request(r)
    result = run(sched, FakeRunner(block_size=4))
    assert result.finish["bad"] == "abort"
    assert result.tokens["bad"] == reference_outputs(r.prompt_token_ids, 2)
    assert feature.finished_ids == [("bad", RequestStatus.RUNNING)]
    assert kv.block_pool.get_num_free_blocks() == kv.block_pool.num_blocks - 1


def _function_lines(tree: ast.Module, cls: str, name: str) -> int:
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    fn = next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == name)
    return fn.end_lineno - fn.lineno + 1


def test_the_scheduler_names_no_feature_and_reads_in_one_screen():
    """The scheduler calls its features through the seam only: no attribute or name of a
    built-in feature appears in scheduler.py or request_book.py; schedule() fits one screen."""
    features = {"spec_decode", "kv_transfer", "lora_admission", "lora_request", "pooling_params", "structured_output",
                "spec_token_ids"}
    for rel in ("core/scheduler/scheduler.py", "core/scheduler/request_book.py"):
        tree = ast.parse((REPO / rel).read_text(encoding="utf-8"))
        named = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | {
            n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        assert not named & features, f"{rel} names {sorted(named & features)}: go through the feature seam"
    source = (REPO / "core/scheduler/scheduler.py").read_text(encoding="utf-8")
    assert _function_lines(ast.parse(source), "Scheduler", "schedule") <= 120
    assert len(source.splitlines()) <= 450
