"""GroupCoordinator collectives on two real gloo processes (tp = 2), and the one-rank short cut."""

import multiprocessing as mp

import torch
from spawned_ranks import free_port, group_rank_main


def test_two_gloo_ranks_run_every_collective():
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=group_rank_main, args=(r, init, out)) for r in range(2)]
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
