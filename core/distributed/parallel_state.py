"""This worker process's place in its engine's rank grid: the world process group and one
:class:`GroupCoordinator` per parallel dimension.

``init_distributed`` runs once per worker (from ``Worker.init_device`` when the engine has more
than one rank); model code then asks ``get_tp_group()`` / ``get_pp_group()``. Without it (one
rank, the uniproc executor) both return a one-rank group whose collectives do nothing, so the
same model code runs sharded or not. One engine is one ``torch.distributed`` world of
tensor x pipeline ranks; data-parallel engines of a dense model are independent worlds.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

import torch
import torch.distributed as dist

from host.core.distributed.group import GroupCoordinator
from host.core.distributed.topology import rank_grid

logger = logging.getLogger("host.distributed")

# how long a rank waits for the others at start-up and in one collective before giving up
DEFAULT_TIMEOUT = datetime.timedelta(minutes=10)

_TP: GroupCoordinator | None = None
_PP: GroupCoordinator | None = None
_EPLB: GroupCoordinator | None = None  # --enable-eplb: the expert ranks again, as a process group of its own
_EP: GroupCoordinator | None = None  # -dp N --enable-expert-parallel: every engine's ranks at this stage


def init_distributed(
    parallel_config: Any,
    rank: int,
    local_rank: int,
    backend: str = "gloo",
    device: torch.device | None = None,
    timeout: datetime.timedelta = DEFAULT_TIMEOUT,
) -> None:
    """Join the engine's world (``parallel_config.distributed_init_method``, a ``tcp://`` address
    the executor chose) as ``rank`` and build the TP and PP groups of :func:`rank_grid`.

    ``backend`` is the platform's device backend (``gloo`` on CPU, ``nccl`` on CUDA); object
    collectives and barriers always use gloo."""
    global _TP, _PP, _EPLB, _EP
    tp, pp, dp = parallel_config.tensor_parallel_size, parallel_config.pipeline_parallel_size, 1
    expert_dp = bool(getattr(parallel_config, "expert_data_parallel", False))
    if expert_dp:  # one world for every engine's workers: this engine's ranks come after the engines before
        dp = parallel_config.data_parallel_size
        rank = parallel_config.data_parallel_rank * tp * pp + rank
    world = tp * pp * dp
    if world == 1:
        return
    if not dist.is_initialized():
        if not parallel_config.distributed_init_method:
            raise ValueError("parallel_config.distributed_init_method is unset; the executor must choose one (tcp://127.0.0.1:PORT)")
        dist.init_process_group(
            backend=backend, init_method=parallel_config.distributed_init_method,
            world_size=world, rank=rank, timeout=timeout,
        )
    groups = rank_grid(world, tp, pp, dp, moe=expert_dp)
    _TP = GroupCoordinator(groups["tp"], rank, local_rank, backend, "tp", device)
    _PP = GroupCoordinator(groups["pp"], rank, local_rank, backend, "pp", device)
    if expert_dp:
        _EP = GroupCoordinator(groups["ep"], rank, local_rank, backend, "ep", device)
    if getattr(parallel_config, "enable_eplb", False):
        # the same ranks as the expert-parallel group (the tensor-parallel one within an engine), but
        # separate process groups, so that moving weights never interleaves with the forward's
        # collectives (seed §8.1)
        _EPLB = GroupCoordinator(groups["ep" if expert_dp else "tp"], rank, local_rank, backend, "eplb", device)
    if backend == "gloo" and not expert_dp:  # CPU ranks: the same-host shared-memory all-reduce (off with HOST_SHM_ALLREDUCE=0)
        from host.core.distributed.shm_all_reduce import install_shm_all_reduce

        install_shm_all_reduce(_TP)
    if rank == 0:
        logger.info("Distributed: world %d, tensor parallel groups %s, pipeline parallel groups %s%s", world, groups["tp"],
                    groups["pp"], f", expert parallel groups {groups['ep']}" if expert_dp else "")


def model_parallel_initialized() -> bool:
    return _TP is not None


def get_tp_group() -> GroupCoordinator:
    """This rank's tensor-parallel group (a one-rank group when the engine is not distributed)."""
    return _TP if _TP is not None else GroupCoordinator.single("tp")


def get_pp_group() -> GroupCoordinator:
    """This rank's pipeline-parallel group (a one-rank group when the engine is not distributed)."""
    return _PP if _PP is not None else GroupCoordinator.single("pp")


def get_ep_group() -> GroupCoordinator | None:
    """The expert-parallel group spanning the data-parallel engines (``-dp N
    --enable-expert-parallel``), else ``None`` (expert parallelism, if on, uses the TP group)."""
    return _EP


def get_eplb_group() -> GroupCoordinator:
    """The load balancer's group (``--enable-eplb``; a one-rank group otherwise)."""
    return _EPLB if _EPLB is not None else GroupCoordinator.single("eplb")


def destroy_distributed() -> None:
    """Tear the groups down (each: fast communicator, device group, CPU group), then the world."""
    global _TP, _PP, _EPLB, _EP
    for group in (_EPLB, _EP, _PP, _TP):
        if group is not None:
            group.destroy()
    _TP = _PP = _EPLB = _EP = None
    if dist.is_initialized():
        dist.destroy_process_group()
