"""GroupCoordinator collectives on two real gloo processes (tp = 2), and the one-rank short cut."""

import multiprocessing as mp
import socket
import traceback
from types import SimpleNamespace

import torch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, init_method: str, out) -> None:
    try:
        torch.set_num_threads(1)
        from host.core.distributed import parallel_state as ps

        ps.init_distributed(SimpleNamespace(tensor_parallel_size=2, pipeline_parallel_size=1, distributed_init_method=init_method), rank, rank)
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


def test_two_gloo_ranks_run_every_collective():
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    init = f"tcp://127.0.0.1:{_free_port()}"
    procs = [ctx.Process(target=_rank_main, args=(r, init, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    for rank, res in results.items():
        assert isinstance(res, dict), res
        assert res["tp"] == ([0, 1], rank, 2) and res["pp"] == ([rank], 1)
        assert res["all_reduce"] == [3.0] * 4 and res["fallback"] == [3.0] * 4 and res["declined"] == 1
        assert res["fast"] == [7.0] * 4
        assert res["all_gather"] == [[0, 0], [1, 1]]
        assert res["broadcast"] == [10]
        assert res["object"] == {"from": 0}
        assert res["gathered"] == [0, 2]
        assert res["after"] is False
    assert results[1]["recv"] == [0.0, 1.0, 2.0] and results[1]["recv_object"] == ["hello"]


def test_a_one_rank_group_short_circuits_without_process_groups():
    from host.core.distributed.parallel_state import get_pp_group, get_tp_group

    g = get_tp_group()
    assert (g.world_size, g.rank_in_group, g.is_first_rank, g.is_last_rank) == (1, 0, True, True)
    x = torch.ones(3)
    assert g.all_reduce(x) is x and g.all_gather(x) is x and g.broadcast(x) is x
    assert g.broadcast_object("o") == "o" and g.all_gather_object(1) == [1]
    g.barrier()
    assert get_pp_group().world_size == 1
