"""The same-host shared-memory all-reduce on real spawned gloo ranks: sums equal torch's (and
gloo's), declined tensors fall back to gloo, a missing peer times out with its name, a rank that
cannot map the segment turns it off on every rank, and nothing is left in /dev/shm."""

import multiprocessing as mp
import os
import socket
import traceback
from types import SimpleNamespace

import pytest
import torch

from host.core.distributed.shm_all_reduce import NAME_PREFIX, SHM_DIR

pytestmark = pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason="needs /dev/shm")

WORLD = 3
SHAPES = [(576,), (3, 576), (7,), (2, 5, 33), (16384,)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _inputs(rank: int, shape, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + sum(shape) + DTYPES.index(dtype))
    return torch.randn(shape, generator=g).to(dtype)


def _expected(world: int, shape, dtype) -> torch.Tensor:
    """torch's sum of every rank's input, in fp32 in rank order, rounded once to the dtype."""
    acc = torch.zeros(shape, dtype=torch.float32)
    for r in range(world):
        acc += _inputs(r, shape, dtype).float()
    return acc.to(dtype)


def _ours() -> list[str]:
    return [n for n in os.listdir(SHM_DIR) if n.startswith(NAME_PREFIX)]


def _sums(shm, rank: int, world: int, dist, group) -> tuple[list, list]:
    """Every (dtype, shape) through ``shm``: compared with torch's sum, and in fp32 with two ranks
    with gloo's; returns the mismatches and a digest per result (equal on every rank)."""
    mismatches, digests = [], []
    for dtype in DTYPES:
        for shape in SHAPES:
            x = _inputs(rank, shape, dtype)
            got, want = shm(x.clone()), _expected(world, shape, dtype)
            if got is None or not torch.equal(got, want):
                mismatches.append((str(dtype), shape, None if got is None else (got.float() - want.float()).abs().max().item()))
                continue
            digests.append(got.float().double().sum().item())
            if dtype == torch.float32 and world == 2:  # a + b: gloo reduces to the same bits
                ref = x.clone()
                dist.all_reduce(ref, group=group.device_group)
                if not torch.equal(ref, got):
                    mismatches.append(("gloo", shape))
    return mismatches, digests


def _rank_main(rank: int, init_method: str, init2: str, out) -> None:
    try:
        torch.set_num_threads(1)
        os.environ["HOST_SHM_ALLREDUCE_MAX_BYTES"] = "65536"
        import torch.distributed as dist

        from host.core.distributed import parallel_state as ps
        from host.core.distributed.group import GroupCoordinator
        from host.core.distributed.shm_all_reduce import ShmAllReduce

        ps.init_distributed(SimpleNamespace(tensor_parallel_size=WORLD, pipeline_parallel_size=1, distributed_init_method=init_method), rank, rank)
        tp = ps.get_tp_group()
        shm = tp.fast_all_reduce
        res: dict = {"installed": isinstance(shm, ShmAllReduce), "pid": os.getpid()}
        res["named_after_setup"] = [n for n in _ours() if n.startswith(f"{NAME_PREFIX}{os.getpid()}-")]
        with torch.inference_mode():  # as the model runner calls it; the calls below are outside it
            res["mismatches"], res["digests"] = _sums(shm, rank, WORLD, dist, tp)
        # two ranks of the three: [0, 1] get their own group and communicator, rank 2 a one-rank group
        pair = GroupCoordinator([[0, 1], [2]], rank, rank, "gloo", "pair")
        pair_shm = ShmAllReduce(pair)
        res["pair"] = _sums(pair_shm, rank, 2, dist, pair) if rank < 2 else (pair_shm.enabled, pair_shm(torch.ones(4)))
        pair_shm.close()
        pair.destroy()
        # many calls in a row: the two slot sets alternate without a peer overwriting unread data
        y = torch.full((4096,), float(rank + 1))
        res["repeat_ok"] = all(torch.equal(shm(y.clone()), torch.full((4096,), 6.0)) for _ in range(200))
        # declined: the fast path says None, the group falls back to gloo with the same sum
        declined = {
            "int64": torch.arange(8) + rank,
            "non_contiguous": torch.arange(12.0).reshape(3, 4).t() + rank,
            "over_max_bytes": torch.full((16385,), float(rank + 1)),
        }
        res["declined"] = {k: shm(v.clone()) is None for k, v in declined.items()}
        res["fallback"] = {k: tp.all_reduce(v.clone()).tolist() for k, v in declined.items()}
        # a peer that never arrives: a second communicator with a short timeout, called by rank 0 only
        late = ShmAllReduce(tp, timeout_s=0.5)
        if rank == 0:
            try:
                late(torch.ones(4))
                res["timeout"] = "no error"
            except RuntimeError as e:
                res["timeout"] = str(e)
            try:
                late(torch.ones(4))
                res["after_timeout"] = "no error"
            except RuntimeError as e:
                res["after_timeout"] = str(e)
        late.close()
        tp.barrier()
        # a rank that cannot map the segment: every rank turns it off and gloo reduces
        broken = ShmAllReduce(tp, shm_dir=SHM_DIR if rank != 1 else "/nonexistent-shm-dir")
        res["broken"] = (broken.enabled, broken.reason, broken(torch.ones(4)))
        tp.set_fast_all_reduce(broken, broken.close)
        res["broken_fallback"] = tp.all_reduce(torch.full((4,), float(rank))).tolist()
        tp.set_fast_all_reduce(shm, shm.close)
        ps.destroy_distributed()
        res["after_close"] = shm(torch.ones(4))
        # the switch: init_distributed with HOST_SHM_ALLREDUCE=0 keeps gloo only
        os.environ["HOST_SHM_ALLREDUCE"] = "0"
        ps.init_distributed(SimpleNamespace(tensor_parallel_size=WORLD, pipeline_parallel_size=1, distributed_init_method=init2), rank, rank)
        res["switched_off"] = (ps.get_tp_group().fast_all_reduce, ps.get_tp_group().all_reduce(torch.ones(2)).tolist())
        ps.destroy_distributed()
        out.put((rank, res))
    except BaseException:
        out.put((rank, traceback.format_exc()))


def test_shm_all_reduce_on_three_spawned_gloo_ranks():
    before = set(_ours())
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    inits = [f"tcp://127.0.0.1:{_free_port()}" for _ in range(2)]
    procs = [ctx.Process(target=_rank_main, args=(r, *inits, out)) for r in range(WORLD)]
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
    left = [n for n in set(_ours()) - before if int(n[len(NAME_PREFIX):].split("-")[0]) in pids]
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
