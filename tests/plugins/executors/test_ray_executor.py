"""The Ray executor against a real local Ray cluster (this machine only, 2 CPUs) that this module starts
and stops: one engine (``-tp 2 --distributed-executor-backend ray``, two CPU actors; a tiny Qwen3
with its kv heads split; prefix caching and chunked prefill on) serves every test, in file order;
the last one kills an actor.

- greedy tokens equal transformers' on the same weights, logprobs within 1e-4 (fp32), and each
  actor caches one of the two kv heads (the model is split, not replicated);
- a plugin installed only in the cluster's environment (the recorder fixture, through its entry
  points) is loaded by each Ray actor itself, exactly the worker groups (vLLM #5657); the engine's
  plugin allowlist reaches the actors;
- a second engine that cannot get its placement group fails with the guidance, and leaves no
  placement group behind;
- without Ray installed, choosing the executor names ``pip install host[ray]``; the bundles per
  platform (a GPU bundle checked without a GPU);
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

# a shared 20-token prefix (block size 16: one block from the prefix cache the second time), prompts
# longer than the 8-token step budget (chunked prefill)
PREFIX = [11, 23, 5, 78, 140, 9, 33, 61, 2, 250, 17, 88, 4, 120, 45, 6, 99, 210, 31, 7]
PROMPTS = [PREFIX + [12, 13], PREFIX + [40], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]]
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
    # GQA with the kv heads split over the 2 ranks, q/k norms, an untied LM head, a vocabulary 2 does not divide
    return tiny_checkpoint("qwen3", num_key_value_heads=2, tie_word_embeddings=False, vocab_size=301)


@pytest.fixture(scope="module")
def llm(ray_cluster, record_file, model_path):
    engine = LLM(str(model_path), skip_tokenizer_init=True, max_model_len=96, tensor_parallel_size=2,
                 distributed_executor_backend="ray", kv_cache_memory=4 * 2**20, max_num_batched_tokens=8,
                 max_num_seqs=4, enable_prefix_caching=True, enable_chunked_prefill=True)
    yield engine
    engine.shutdown()


def _executor(llm):
    executor = llm.engine.executor
    assert isinstance(executor, ray_executor.RayExecutor)
    return executor


def test_tp2_over_ray_matches_transformers(llm, model_path):
    import torch

    params = SamplingParams(max_tokens=N_TOKENS, temperature=0.0, ignore_eos=True, logprobs=1)
    outs = []
    for batch in (PROMPTS[:1], PROMPTS):  # the second batch reuses the first's cached prefix block
        outs += [(p, o.outputs[0]) for p, o in zip(batch, llm.generate([{"prompt_token_ids": p} for p in batch], params))]
    reference = hf_model(model_path)
    for prompt, comp in outs:
        tokens = list(comp.token_ids)
        assert tokens == hf_greedy(reference, prompt, N_TOKENS), prompt
        with torch.inference_mode():  # the reference logprob of each sampled token, fp32
            logits = reference(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1]
        expected = torch.log_softmax(logits.float(), -1)[torch.arange(len(tokens)), tokens]
        got = torch.tensor([pos[t].logprob for t, pos in zip(tokens, comp.logprobs)])
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)
    executor = _executor(llm)
    assert len(executor.actors) == 2 and os.getpid() not in executor.pids
    assert all(psutil.Process(pid).is_running() for pid in executor.pids)
    # the model is split, not replicated: each actor caches one of the model's 2 kv heads
    specs = executor.collective_rpc("get_kv_cache_specs")
    assert [{spec.num_kv_heads for spec in rank_specs} for rank_specs in specs] == [{1}, {1}]


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
    for rank_rows in records:
        recorder = {r["group"] for r in rank_rows if r["distribution"] == "host-fixture-recorder" and r["status"] == "loaded"}
        assert recorder == expected, recorder  # its worker-group plugins, loaded in the actor
    executor.check_health()


def test_the_engine_plugin_settings_reach_the_actors(llm, ray_cluster, record_file):
    """An empty allowlist (``HOST_PLUGINS=""``, as ``--plugins ""`` sets it in the engine) keeps the
    recorder out of an actor although the cluster has it installed; host's own plugins still load."""
    from host.core.plugins.settings import PluginSettings
    from host.sdk.runtime import current_platform

    env = ray_executor.worker_env(PluginSettings(allow=()).to_env(), current_platform())
    assert env["HOST_PLUGINS"] == "" and env["HOST_FIXTURE_RECORD"] == str(record_file)
    actor = ray_cluster.remote(ray_executor.RayWorker).options(num_cpus=0).remote(env)  # beside the engine's bundles
    try:
        pid = ray_cluster.get(actor.ping.remote(), timeout=120)
        records = ray_cluster.get(actor.plugin_records.remote(), timeout=60)
    finally:
        ray_cluster.kill(actor)
    recorder = [r for r in records if r["distribution"] == "host-fixture-recorder"]
    assert recorder and all(r["status"] != "loaded" for r in recorder), recorder
    assert any(r["builtin"] and r["status"] == "loaded" for r in records)
    assert pid not in {json.loads(line)["pid"] for line in record_file.read_text().splitlines()}


def test_a_placement_group_that_cannot_be_placed_is_explained(llm, model_path, ray_cluster, monkeypatch):
    monkeypatch.setenv(ray_executor.ENV_PG_TIMEOUT, "2")
    before = len(ray_cluster.util.placement_group_table())
    with pytest.raises(RuntimeError, match=r"placement group of 2 bundles .* not placed within 2 s.*`ray status`.*this machine's address"):
        LLM(str(model_path), skip_tokenizer_init=True, max_model_len=96, tensor_parallel_size=2,
            distributed_executor_backend="ray", kv_cache_memory=4 * 2**20)
    table = ray_cluster.util.placement_group_table()
    assert sum(pg["state"] != "REMOVED" for pg in table.values()) == 1  # only the module engine's
    assert len(table) == before + 1


def test_without_ray_the_error_names_the_extra(monkeypatch, model_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ImportError, match=r"pip install host\[ray\]"):
        LLM(str(model_path), skip_tokenizer_init=True, max_model_len=64, tensor_parallel_size=2,
            distributed_executor_backend="ray")


def test_bundles_per_platform():
    """One bundle per rank with the platform's Ray device key; bundle 0 pinned to the driver's node."""
    from host.plugins.builtin_cpu.platform import CpuPlatform
    from host.plugins.builtin_cuda.platform import CudaPlatform
    from host.sdk import Platform

    assert ray_executor.bundles_for(2, CpuPlatform(), "10.0.0.5") == [{"CPU": 1.0, "node:10.0.0.5": 0.001}, {"CPU": 1.0}]
    assert ray_executor.bundles_for(2, CudaPlatform(), "10.0.0.5") == [
        {"GPU": 1.0, "CPU": 1.0, "node:10.0.0.5": 0.001}, {"GPU": 1.0, "CPU": 1.0},
    ]

    class NoRay(Platform):
        name = "npu"
        device_type = "npu"

    with pytest.raises(ValueError, match="the npu platform names no Ray resource .*--distributed-executor-backend mp"):
        ray_executor.bundles_for(2, NoRay(), "10.0.0.5")


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
    while any(map(_alive, pids)):
        assert time.monotonic() < deadline, f"actor processes left: {[p for p in pids if _alive(p)]}"
        time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False

