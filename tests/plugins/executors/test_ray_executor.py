"""The Ray executor against a real local Ray cluster (this machine only, 2 CPUs) that this module starts
and stops: one engine (``-tp 2 --distributed-executor-backend ray``, two CPU actors) serves every
test, in file order; the last one kills an actor.

- greedy tokens equal transformers' on the same weights;
- a plugin installed only in the cluster's environment (the recorder fixture, through its entry
  points) is loaded by each Ray actor itself, exactly the worker groups (vLLM #5657);
- a second engine that cannot get its placement group fails with the guidance, and leaves no
  placement group behind;
- without Ray installed, choosing the executor names ``pip install host[ray]``;
- killing one actor mid-generation fails the generation with a clear error within seconds and
  leaves no actor process alive.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import psutil
import pytest

import host.plugins.executors.ray as ray_executor
from helpers import hf_greedy, hf_model
from host import LLM, SamplingParams
from host.hooks.groups import GROUPS, groups_for

PROMPTS = [[1, 5, 9, 42, 7], [3, 17, 250, 8, 99, 101, 4]]
N_TOKENS = 8


@pytest.fixture(scope="module")
def ray_cluster(fixture_sites):
    """A local Ray cluster whose processes have the recorder fixture plugin installed (on their
    PYTHONPATH), while this test process does not."""
    import ray

    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([fixture_sites["recorder"], *([saved] if saved else [])])
    try:
        # Ray resolves a loopback node address to this machine's own address: the cluster is local
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 * 2**20, log_to_driver=False)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    yield ray
    ray.shutdown()
    os.environ.pop("RAY_ADDRESS", None)


@pytest.fixture(scope="module")
def record_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("ray-record") / "record.jsonl"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOST_FIXTURE_RECORD", str(path))  # HOST_* variables reach the actors
        yield path


@pytest.fixture(scope="module")
def model_path(tiny_checkpoint):
    return tiny_checkpoint("llama")


@pytest.fixture(scope="module")
def llm(ray_cluster, record_file, model_path):
    engine = LLM(str(model_path), skip_tokenizer_init=True, max_model_len=64, tensor_parallel_size=2,
                 distributed_executor_backend="ray", kv_cache_memory=4 * 2**20)
    yield engine
    engine.shutdown()


def _executor(llm):
    executor = llm.engine.executor
    assert isinstance(executor, ray_executor.RayExecutor)
    return executor


def test_tp2_over_ray_matches_transformers(llm, model_path):
    params = SamplingParams(max_tokens=N_TOKENS, temperature=0.0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    reference = hf_model(model_path)
    assert [list(o.outputs[0].token_ids) for o in outs] == [hf_greedy(reference, p, N_TOKENS) for p in PROMPTS]
    executor = _executor(llm)
    assert len(executor.actors) == 2 and os.getpid() not in executor.pids
    assert all(psutil.Process(pid).is_running() for pid in executor.pids)


def test_ray_actors_load_the_worker_groups_themselves(llm, record_file):
    executor = _executor(llm)
    rows = [json.loads(line) for line in record_file.read_text().splitlines()]
    assert rows, "no Ray actor loaded the recorder plugin"
    assert {r["pid"] for r in rows} == set(executor.pids)  # this process does not have the plugin
    expected = set(groups_for("worker")) & (set(GROUPS) - {"host.endpoints"})
    for pid in executor.pids:
        groups = [r["group"] for r in rows if r["pid"] == pid]
        assert {r["process"] for r in rows if r["pid"] == pid} == {"worker"}
        assert len(groups) == len(set(groups)) and set(groups) == expected, (pid, groups)
    # what the actors report about their plugins comes from their own plugin hosts
    records = executor.collective_rpc("plugin_records")
    assert [{row["process_pid"] for row in rank_rows} for rank_rows in records] == [{pid} for pid in executor.pids]
    assert all(any(row["name"] == "host_fixture_recorder" or "recorder" in json.dumps(row) for row in rank_rows) for rank_rows in records)
    executor.check_health()


def test_a_placement_group_that_cannot_be_placed_is_explained(llm, model_path, ray_cluster, monkeypatch):
    monkeypatch.setenv(ray_executor.ENV_PG_TIMEOUT, "2")
    before = len(ray_cluster.util.placement_group_table())
    with pytest.raises(RuntimeError, match=r"placement group of 2 bundles .* not placed within 2 s.*`ray status`.*this machine's address"):
        LLM(str(model_path), skip_tokenizer_init=True, max_model_len=64, tensor_parallel_size=2,
            distributed_executor_backend="ray", kv_cache_memory=4 * 2**20)
    table = ray_cluster.util.placement_group_table()
    assert sum(pg["state"] != "REMOVED" for pg in table.values()) == 1  # only the module engine's
    assert len(table) == before + 1


def test_without_ray_the_error_names_the_extra(monkeypatch, model_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ImportError, match=r"pip install host\[ray\]"):
        LLM(str(model_path), skip_tokenizer_init=True, max_model_len=64, tensor_parallel_size=2,
            distributed_executor_backend="ray")


def test_killing_an_actor_mid_generation_fails_clearly_and_leaves_nothing(llm):
    executor = _executor(llm)
    pids = list(executor.pids)
    scheduler = llm.engine.scheduler
    killed_at: list[float] = []

    def kill_when_generating() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                generating = any(r.num_output_tokens >= 2 for r in list(scheduler.requests.values()))
            except RuntimeError:  # the dict changed under us
                generating = False
            if generating:
                os.kill(pids[1], signal.SIGKILL)
                killed_at.append(time.monotonic())
                return
            time.sleep(0.002)

    killer = threading.Thread(target=kill_when_generating, daemon=True)
    killer.start()
    params = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)
    with pytest.raises(RuntimeError, match=rf"worker rank 1 \(pid {pids[1]}\) died"):
        llm.generate([{"prompt_token_ids": p} for p in PROMPTS * 4], params)
    failed_at = time.monotonic()
    killer.join(5)
    assert killed_at, "the generation ended before an actor could be killed"
    assert failed_at - killed_at[0] < 10
    with pytest.raises(RuntimeError, match="died"):
        executor.check_health()
    deadline = time.monotonic() + 15
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
        assert time.monotonic() < deadline, f"actor processes left: {[p for p in pids if psutil.pid_exists(p)]}"
        time.sleep(0.2)
