"""The same-host shared-memory all-reduce on real spawned gloo ranks: sums equal torch's (and
gloo's), declined tensors fall back to gloo, a missing peer times out with its name, a rank that
cannot map the segment turns it off on every rank, and nothing is left in /dev/shm."""

import multiprocessing as mp
import os

import pytest
import torch
from spawned_ranks import WORLD, free_port, ours, shm_rank_main

from host.core.distributed.shm_all_reduce import NAME_PREFIX, SHM_DIR

pytestmark = pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason="needs /dev/shm")


def test_shm_all_reduce_on_three_spawned_gloo_ranks():
    before = set(ours())
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    inits = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    procs = [ctx.Process(target=shm_rank_main, args=(r, *inits, out)) for r in range(WORLD)]
    for p in procs:
        p.start()
    try:
        results = dict(out.get(timeout=120) for _ in procs)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
    assert [p.exitcode for p in procs] == [0] * WORLD
    for rank, res in results.items():
        assert isinstance(res, dict), res
        assert res["installed"] is True
        assert res["named_after_setup"] == []  # unlinked as soon as every rank mapped it
        assert res["mismatches"] == [], res["mismatches"]
        assert res["pair"][0] == [] if rank < 2 else res["pair"] == (False, None)
        assert res["repeat_ok"] is True
        assert res["declined"] == {"int64": True, "non_contiguous": True, "over_max_bytes": True}
        assert res["fallback"]["int64"] == [3 * i + 3 for i in range(8)]
        assert res["fallback"]["non_contiguous"] == (torch.arange(12.0).reshape(3, 4).t() * 3 + 3).tolist()
        assert res["fallback"]["over_max_bytes"] == [6.0] * 16385
        enabled, reason, called = res["broken"]
        assert enabled is False and called is None
        assert "group ordinal 1" in reason and "/nonexistent-shm-dir" in reason
        assert res["broken_fallback"] == [3.0] * 4
        assert res["after_close"] is None
        assert res["switched_off"] == (None, [3.0, 3.0])
    assert len({tuple(res["digests"]) for res in results.values()}) == 1  # bit-identical on every rank
    assert results[0]["pair"][1] == results[1]["pair"][1]
    timeout = results[0]["timeout"]
    assert "group ordinal 1 (global rank 1), group ordinal 2 (global rank 2)" in timeout and "0.5 s" in timeout, timeout
    assert results[0]["after_timeout"] == timeout  # out of step for good: it keeps saying so
    pids = {res["pid"] for res in results.values()}
    left = [n for n in set(ours()) - before if int(n[len(NAME_PREFIX) :].split("-")[0]) in pids]
    assert left == []


def test_a_one_rank_group_builds_none_and_a_bad_size_is_named(monkeypatch):
    from host.core.distributed.group import GroupCoordinator
    from host.core.distributed.shm_all_reduce import ShmAllReduce, install_shm_all_reduce

    g = GroupCoordinator.single("tp")
    assert install_shm_all_reduce(g) is None and g.fast_all_reduce is None
    shm = ShmAllReduce(g)
    assert shm.enabled is False and shm(torch.ones(4)) is None
    monkeypatch.setenv("HOST_SHM_ALLREDUCE_MAX_BYTES", "lots")
    with pytest.raises(ValueError, match="HOST_SHM_ALLREDUCE_MAX_BYTES='lots'"):
        ShmAllReduce(g)
