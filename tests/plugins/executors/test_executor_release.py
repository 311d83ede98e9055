"""Executors free what they hold, on ``LLM.shutdown()`` and on plain deletion (``del llm`` + gc), on a
tiny random Llama with ``-tp 2``: real worker processes, a real local Ray cluster (this module's,
on this machine, 2 CPUs: room for exactly one tp=2 engine at a time).

- ``mp``: after ``shutdown()`` (twice: the second does nothing) the worker processes are gone and
  so is the broadcast's block in ``/dev/shm`` (and no shared-memory all-reduce segment of a
  worker is left); a second engine deleted without ``shutdown()`` frees the same as ``del``
  returns;
- ``ray``: a first engine deleted with ``del`` + gc gives its actors and placement group back, so
  a second one in the same process is placed at once (before, it waited for
  ``HOST_RAY_PG_TIMEOUT`` and failed: the first engine's bundles were never returned) and
  generates; after its ``shutdown()`` every placement group is ``REMOVED``, no actor process is
  alive and the cluster's CPUs are free again; an engine whose actor was killed shuts down promptly.
"""

from __future__ import annotations

import gc
import os
import signal
import time

import psutil
import pytest

from host import LLM, SamplingParams
from host.core.distributed.shm_all_reduce import NAME_PREFIX, SHM_DIR

PROMPTS = [[5, 17, 42, 99, 3, 250, 7], [11, 12, 13]]
PARAMS = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
ENGINE = dict(skip_tokenizer_init=True, max_model_len=64, num_gpu_blocks_override=16, block_size=16,
              optimization_level=0, attention_backend="torch_paged", tensor_parallel_size=2)


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("llama", seed=3)


def _generate(llm: LLM) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    assert all(len(t) == PARAMS.max_tokens for t in tokens)
    return tokens


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(pids: list[int], within: float) -> None:
    deadline = time.monotonic() + within
    while any(map(_alive, pids)):
        assert time.monotonic() < deadline, f"processes left {within} s later: {[p for p in pids if _alive(p)]}"
        time.sleep(0.05)


def _mp_holdings(llm: LLM) -> tuple[list[int], str]:
    executor = llm.engine.executor
    assert executor.name == "mp"
    pids = [p.pid for p in executor.workers]
    block = os.path.join(SHM_DIR, executor.broadcast.handle().shm_name.lstrip("/"))
    assert all(map(_alive, pids)) and os.path.exists(block)
    return pids, block


def _assert_mp_freed(pids: list[int], block: str) -> None:
    assert not any(map(_alive, pids)), [p for p in pids if _alive(p)]  # gone at once, not eventually
    assert not os.path.exists(block)
    left = [n for n in os.listdir(SHM_DIR) if n.startswith(NAME_PREFIX) and any(n.startswith(f"{NAME_PREFIX}{p}-") for p in pids)]
    assert not left, left


def test_mp_shutdown_and_deletion_free_the_workers_and_the_shared_memory(checkpoint):
    llm = LLM(str(checkpoint), distributed_executor_backend="mp", **ENGINE)
    tokens = _generate(llm)
    pids, block = _mp_holdings(llm)
    llm.shutdown()
    _assert_mp_freed(pids, block)
    llm.shutdown()  # the second does nothing
    with pytest.raises(RuntimeError, match="shut down"):
        llm.engine.executor.collective_rpc("ping")

    second = LLM(str(checkpoint), distributed_executor_backend="mp", **ENGINE)
    assert _generate(second) == tokens
    pids, block = _mp_holdings(second)
    del second  # its reference count frees it: no gc.collect() needed (the engine froze the older objects out of gc)
    _assert_mp_freed(pids, block)


@pytest.fixture(scope="module")
def ray_cluster():
    """This module's local Ray cluster: 2 CPUs, one tp=2 engine's worth."""
    import ray

    assert not ray.is_initialized(), "another test module left Ray initialized"
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 * 2**20, log_to_driver=False)
    yield ray
    ray.shutdown()
    os.environ.pop("RAY_ADDRESS", None)


def _ray_holdings(llm: LLM) -> tuple[list[int], object]:
    executor = llm.engine.executor
    assert executor.name == "ray"
    return list(executor.pids), executor.hold.pg.id.hex()


def test_ray_deletion_frees_the_placement_group_for_the_next_engine(checkpoint, ray_cluster, monkeypatch):
    # the old code waited this long for the second engine's bundles, then failed
    monkeypatch.setenv("HOST_RAY_PG_TIMEOUT", "20")
    first = LLM(str(checkpoint), distributed_executor_backend="ray", **ENGINE)
    tokens = _generate(first)
    first_pids, first_pg = _ray_holdings(first)
    deleted = time.monotonic()
    del first
    gc.collect()
    freed = time.monotonic() - deleted
    assert ray_cluster.util.placement_group_table()[first_pg]["state"] == "REMOVED"  # before `del` returned
    assert freed < 10, freed

    second = LLM(str(checkpoint), distributed_executor_backend="ray", **ENGINE)
    ready = time.monotonic() - deleted
    print(f"\n`del` of the first ray engine: {freed:.2f} s; `del` to the second engine ready: {ready:.1f} s")
    assert _generate(second) == tokens
    _wait_gone(first_pids, within=10)
    pids, pg = _ray_holdings(second)
    assert pg != first_pg and set(pids).isdisjoint(first_pids)

    second.shutdown()
    second.shutdown()  # the second does nothing
    table = ray_cluster.util.placement_group_table()
    assert {pg_id: entry["state"] for pg_id, entry in table.items()} == {first_pg: "REMOVED", pg: "REMOVED"}
    _wait_gone(pids, within=10)
    deadline = time.monotonic() + 10
    while ray_cluster.available_resources().get("CPU", 0.0) < 2.0:
        assert time.monotonic() < deadline, ray_cluster.available_resources()
        time.sleep(0.05)


def test_ray_shutdown_with_a_dead_actor_is_prompt_and_frees_everything(checkpoint, ray_cluster):
    llm = LLM(str(checkpoint), distributed_executor_backend="ray", **ENGINE)
    pids, pg = _ray_holdings(llm)
    os.kill(pids[1], signal.SIGKILL)
    _wait_gone(pids[1:], within=10)
    started = time.monotonic()
    llm.shutdown()
    assert time.monotonic() - started < 10
    assert ray_cluster.util.placement_group_table()[pg]["state"] == "REMOVED"
    _wait_gone(pids, within=10)
