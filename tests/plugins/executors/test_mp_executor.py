"""The ``mp`` executor on a tiny random Llama (GQA: 4 query heads, 2 KV heads) with ``-tp 2``: real
worker processes, a real gloo world, the real shared-memory step broadcast.

- in process (``LLM(tensor_parallel_size=2, distributed_executor_backend="mp")``): greedy tokens
  equal transformers' and the uniproc engine's; every step reached both workers through the
  shared-memory ring (their read counters equal the writer's, no overflow); the worker processes
  loaded exactly the ``worker`` plugin groups (the recorder fixture, by pid); a worker's error
  comes back naming its rank and the executor keeps serving; a worker that cannot load the model
  fails the start with its error, and no process is left;
- behind ``host serve -tp 2``: ``/v1/plugins`` lists the workers' records with their pids; a
  worker killed with SIGKILL mid-stream ends the stream with an error naming the rank within 5 s,
  ``/health`` turns 503, and once the server stops none of its processes is left.
"""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import openai
import psutil
import pytest
from typer.testing import CliRunner

from helpers import hf_greedy, hf_model, on_sys_path, run_server
from host import LLM, SamplingParams
from host.core.entrypoints.cli.main import app
from host.hooks.groups import GROUPS, groups_for

PROMPTS = [[5, 17, 42, 99, 3, 250, 7], [11, 12, 13], list(range(20, 60))]
NEW = 8
ENGINE = dict(skip_tokenizer_init=True, max_model_len=128, num_gpu_blocks_override=32, block_size=16,
              optimization_level=0, attention_backend="torch_paged")


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("llama", seed=7, norm_std=0.2, lm_head_scale=4)  # varied greedy tokens


@pytest.fixture(scope="module")
def recorded(checkpoint, fixture_sites, tmp_path_factory):
    """An in-process tp=2 engine whose workers were spawned with the recorder plugin installed."""
    record = tmp_path_factory.mktemp("mp-record") / "record.jsonl"
    os.environ["HOST_FIXTURE_RECORD"] = str(record)
    try:
        with on_sys_path(fixture_sites["recorder"]):  # the spawned workers inherit this sys.path
            llm = LLM(str(checkpoint), tensor_parallel_size=2, distributed_executor_backend="mp", **ENGINE)
    finally:
        del os.environ["HOST_FIXTURE_RECORD"]
    yield llm, record
    executor = llm.engine.executor
    llm.shutdown()
    assert all(not p.is_alive() for p in executor.workers)


def test_tp2_greedy_equals_transformers_and_uniproc_through_the_shm_broadcast(recorded, checkpoint):
    llm, _ = recorded
    executor = llm.engine.executor
    assert executor.name == "mp" and len(executor.workers) == 2 and executor.output_rank == 0
    params = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
    outs = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)]
    model = hf_model(checkpoint)
    assert outs == [hf_greedy(model, p, NEW) for p in PROMPTS]
    assert len({tuple(o) for o in outs}) == len(PROMPTS) and any(len(set(o)) > 1 for o in outs)
    local = LLM(str(checkpoint), **ENGINE)
    try:
        assert local.engine.executor.name == "uniproc"
        same = local.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
        assert [o.outputs[0].token_ids for o in same] == outs
    finally:
        local.shutdown()
    # every message (each step among them) was read by both workers from the shared ring
    written = dict(executor.broadcast.stats)
    reads = executor.collective_rpc("broadcast_stats")
    assert written["overflow"] == 0 and written["shm"] >= NEW
    assert reads == [{"shm": written["shm"] + 1, "overflow": 0}] * 2  # + the broadcast_stats call itself


def test_workers_load_exactly_the_worker_groups(recorded):
    llm, record = recorded
    worker_pids = {p.pid for p in llm.engine.executor.workers}
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    by_pid: dict[int, list[str]] = {}
    for row in rows:
        if row["pid"] in worker_pids:
            assert row["process"] == "worker", row
            by_pid.setdefault(row["pid"], []).append(row["group"])
    assert set(by_pid) == worker_pids
    expected = set(groups_for("worker")) & (set(GROUPS) - {"host.endpoints"})  # the recorder has no endpoint plugin
    for pid, groups in by_pid.items():
        assert sorted(groups) == sorted(expected), (pid, groups)
    assert "host.executors" not in expected and "host.attention_backends" in expected
    # the engine's listing carries the workers' own records, by process
    rows = llm.engine.utility_plugins()
    workers = {(r["rank"], r["process_pid"]) for r in rows if r["process"] == "worker"}
    assert workers == {(rank, p.pid) for rank, p in enumerate(llm.engine.executor.workers)}
    loaded = {r["group"] for r in rows if r["process"] == "worker" and r["status"] == "loaded"}
    assert "host.executors" not in loaded and "host.attention_backends" in loaded


def test_a_worker_error_names_its_rank_and_the_executor_goes_on(recorded):
    llm, _ = recorded
    executor = llm.engine.executor
    with pytest.raises(RuntimeError, match=r"worker rank 0 no_such_method failed: AttributeError"):
        executor.collective_rpc("no_such_method")
    assert executor.collective_rpc("ping") == [p.pid for p in executor.workers]
    assert executor.collective_rpc("ping", unique_reply_rank=1) == [executor.workers[1].pid]
    # several calls in flight: each handle gets its own reply, whatever order they are waited on in
    handles = [executor.collective_rpc("ping", unique_reply_rank=i % 2, non_blocking=True) for i in range(4)]
    assert [h.get_output() for h in reversed(handles)] == [executor.workers[i % 2].pid for i in reversed(range(4))]


def test_a_worker_that_fails_to_start_is_named_with_its_error_and_nothing_is_left(tiny_checkpoint):
    bare = tiny_checkpoint("llama", weights=False)  # config.json only: the workers find no weights to load
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(RuntimeError, match=r"worker rank \d failed to start: ValueError: .* holds no \*\.safetensors"):
        LLM(str(bare), tensor_parallel_size=2, **ENGINE)
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE
            and "resource_tracker" not in " ".join(p.cmdline())]  # multiprocessing's, for this whole test process
    assert not left, [(p.pid, p.cmdline()) for p in left]


# -- behind a real server ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_checkpoint):
    from host.core.models.default_model import resolve_model_path

    model = tiny_checkpoint("llama", vocab_size=49152, max_position_embeddings=2048)  # SmolLM2's vocabulary
    args = ["--model", str(model), "--tokenizer", resolve_model_path("default"), "-tp", "2", "--max-model-len", "2048",
            "--kv-cache-memory", "32MiB", "-O0", "--attention-backend", "torch_paged", "--no-exit-on-engine-death"]
    with run_server(tmp_path_factory.mktemp("mp-serve"), args) as server:
        server.model = str(model)
        yield server


def test_a_killed_worker_fails_the_stream_turns_health_503_and_leaves_no_process(served):
    processes = httpx.get(f"{served.url}/v1/plugins", timeout=30).json()["processes"]
    assert sorted(processes) == ["api", "engine", "worker 0", "worker 1"]
    worker_pids = sorted({(r["rank"], r["process_pid"]) for w in ("worker 0", "worker 1") for r in processes[w]["plugins"]})
    assert [rank for rank, _ in worker_pids] == [0, 1]
    assert all(r["process"] == "worker" for w in ("worker 0", "worker 1") for r in processes[w]["plugins"])
    # `host plugins list --server URL` prints every process's records, the workers' with their pids
    listing = CliRunner().invoke(app, ["plugins", "list", "--server", served.url])
    assert listing.exit_code == 0, listing.output
    for rank, pid in worker_pids:
        assert any(line.split("│")[1:3] == [f" worker {rank} ", f" {pid} "] for line in listing.output.splitlines() if "│" in line), listing.output
    server_proc = psutil.Process(served.proc.pid)
    tree = server_proc.children(recursive=True)
    assert {pid for _, pid in worker_pids} <= {p.pid for p in tree}

    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0)
    stream = client.completions.create(model=served.model, prompt="Once upon a time", max_tokens=2000, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    next(iter(stream))
    os.kill(worker_pids[1][1], signal.SIGKILL)
    killed = time.monotonic()
    with pytest.raises(openai.APIError, match="worker rank 1"):
        for _ in stream:
            pass
    assert time.monotonic() - killed < 5
    deadline = time.monotonic() + 5
    while (health := httpx.get(f"{served.url}/health", timeout=5)).status_code != 503 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert health.status_code == 503
    served.proc.send_signal(signal.SIGTERM)
    assert served.proc.wait(30) is not None
    gone, alive = psutil.wait_procs(tree, timeout=10)
    assert not alive, [p.pid for p in alive]
