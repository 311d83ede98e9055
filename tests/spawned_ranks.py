"""Code that runs inside the ranks the distributed tests spawn.

Spawned processes import their target by module name, and pytest's importlib mode names test
modules ``tests.…``, which a fresh interpreter cannot import; this module is on ``sys.path`` (the
conftest puts ``tests/`` there, and spawn hands the parent's path to the child), so its functions
can be spawn targets."""

import os
import socket
import traceback
from types import SimpleNamespace

import torch

from host.core.distributed.shm_all_reduce import NAME_PREFIX, SHM_DIR


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group_rank_main(rank: int, init_method: str, out) -> None:
    try:
        torch.set_num_threads(1)
        from host.core.distributed import parallel_state as ps

        ps.init_distributed(
            SimpleNamespace(tensor_parallel_size=2, pipeline_parallel_size=1, distributed_init_method=init_method), rank, rank
        )
        tp, pp = ps.get_tp_group(), ps.get_pp_group()
        res = {"tp": (tp.ranks, tp.rank_in_group, tp.world_size), "pp": (pp.ranks, pp.world_size)}
        x = torch.full((4,), float(rank + 1))
        res["all_reduce"] = tp.all_reduce(x.clone()).tolist()
        declined = []
        tp.set_fast_all_reduce(lambda t: declined.append(1))  # returns None: the device group reduces
        res["fallback"] = tp.all_reduce(x.clone()).tolist()
        tp.set_fast_all_reduce(lambda t: t * 0 + 7)
        res["fast"] = tp.all_reduce(x.clone()).tolist()
        tp.set_fast_all_reduce(None)
        res["declined"] = len(declined)
        res["all_gather"] = tp.all_gather(torch.tensor([[rank, rank]]), dim=0).tolist()
        res["broadcast"] = tp.broadcast(torch.tensor([rank * 10]), src=1).tolist()
        res["object"] = tp.broadcast_object({"from": rank} if rank == 0 else None)
        if rank == 0:
            tp.send(torch.arange(3.0))
            tp.send_object(["hello"])
        else:
            res["recv"] = tp.recv((3,), torch.float32).tolist()
            res["recv_object"] = tp.recv_object()
        res["gathered"] = tp.all_gather_object(rank * 2)
        tp.barrier()
        ps.destroy_distributed()
        res["after"] = ps.model_parallel_initialized()
        out.put((rank, res))
    except BaseException:
        out.put((rank, traceback.format_exc()))


WORLD = 3
SHAPES = [(576,), (3, 576), (7,), (2, 5, 33), (16384,)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _inputs(rank: int, shape, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + sum(shape) + DTYPES.index(dtype))
    return torch.randn(shape, generator=g).to(dtype)


def _expected(world: int, shape, dtype) -> torch.Tensor:
    """torch's sum of every rank's input, in fp32 in rank order, rounded once to the dtype."""
    acc = torch.zeros(shape, dtype=torch.float32)
    for r in range(world):
        acc += _inputs(r, shape, dtype).float()
    return acc.to(dtype)


def ours() -> list[str]:
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


def shm_rank_main(rank: int, init_method: str, init2: str, out) -> None:
    try:
        torch.set_num_threads(1)
        os.environ["HOST_SHM_ALLREDUCE_MAX_BYTES"] = "65536"
        import torch.distributed as dist

        from host.core.distributed import parallel_state as ps
        from host.core.distributed.group import GroupCoordinator
        from host.core.distributed.shm_all_reduce import ShmAllReduce

        ps.init_distributed(
            SimpleNamespace(tensor_parallel_size=WORLD, pipeline_parallel_size=1, distributed_init_method=init_method), rank, rank
        )
        tp = ps.get_tp_group()
        shm = tp.fast_all_reduce
        res: dict = {"installed": isinstance(shm, ShmAllReduce), "pid": os.getpid()}
        res["named_after_setup"] = [n for n in ours() if n.startswith(f"{NAME_PREFIX}{os.getpid()}-")]
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
        ps.init_distributed(
            SimpleNamespace(tensor_parallel_size=WORLD, pipeline_parallel_size=1, distributed_init_method=init2), rank, rank
        )
        res["switched_off"] = (ps.get_tp_group().fast_all_reduce, ps.get_tp_group().all_reduce(torch.ones(2)).tolist())
        ps.destroy_distributed()
        out.put((rank, res))
    except BaseException:
        out.put((rank, traceback.format_exc()))
