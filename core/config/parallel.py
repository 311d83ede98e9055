"""How one model is spread over processes."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class EPLBConfig:
    """The expert-parallel load balancer's settings (``--eplb-config``, JSON; docs/moe.md).

    Every ``step_interval`` engine steps the experts are rearranged from the load recorded over
    the last ``window_size`` steps (recording is off before that). ``num_redundant_experts``
    extra physical experts per MoE layer replicate hot experts. A rearrangement whose balancedness
    gain is below ``min_improvement`` (the seed's 5%) is skipped. ``use_async``: the new weights
    are gathered on a background thread and committed at a later step. ``policy``: the registered
    rebalancing policy (``greedy`` built in). ``log_balancedness``: log it at every rearrangement."""

    window_size: int = 1000
    step_interval: int = 3000
    num_redundant_experts: int = 0
    log_balancedness: bool = False
    use_async: bool = False
    policy: str = "greedy"
    min_improvement: float = 0.05

    def __post_init__(self) -> None:
        for name in ("window_size", "step_interval"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"eplb_config {name}={value!r} must be an integer >= 1")
        if self.window_size > self.step_interval:
            raise ValueError(
                f"eplb_config window_size={self.window_size} is longer than step_interval={self.step_interval}; "
                "the load window lies inside one interval, so make window_size <= step_interval"
            )
        if not isinstance(self.num_redundant_experts, int) or self.num_redundant_experts < 0:
            raise ValueError(f"eplb_config num_redundant_experts={self.num_redundant_experts!r} must be an integer >= 0")
        if not 0.0 <= float(self.min_improvement) < 1.0:
            raise ValueError(f"eplb_config min_improvement={self.min_improvement!r} must be in [0, 1), e.g. 0.05 for 5%")

    @classmethod
    def from_value(cls, value: "EPLBConfig | dict[str, Any] | None") -> "EPLBConfig":
        if isinstance(value, cls):
            return value
        value = dict(value or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"eplb_config has unknown keys {unknown}; it takes {sorted(known)}")
        return cls(**value)


@dataclass
class ParallelConfig:
    """How one model is spread over processes (docs/distributed.md).

    ``tensor_parallel_size`` x ``pipeline_parallel_size`` worker ranks make one engine
    (:attr:`world_size`); ``data_parallel_size`` engines, each with its own workers, serve behind
    one front end. ``distributed_executor_backend`` names the registered executor
    (``host.executors``) that drives one engine's workers: ``None`` means ``uniproc`` for one
    rank and ``mp`` for more. ``pp_layer_partition`` gives each pipeline stage's layer count
    (default: as even as possible). ``data_parallel_rank`` and ``distributed_init_method`` are set
    at start-up, per engine.
    """

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    pp_layer_partition: list[int] | None = None
    distributed_executor_backend: str | None = None
    enable_expert_parallel: bool = False
    enable_eplb: bool = False
    eplb: EPLBConfig = field(default_factory=EPLBConfig)
    # set at start-up
    data_parallel_rank: int = 0
    distributed_init_method: str | None = None
    # -dp N with --enable-expert-parallel: where the engines' cores agree on each step (a TCP
    # store address, tcp://HOST:PORT), chosen by the front end for all of them
    data_parallel_sync_addr: str | None = None

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{name}={value!r} must be an integer >= 1 ({flag} 2 for two)")
        if self.pp_layer_partition is not None:
            parts = list(self.pp_layer_partition)
            if len(parts) != self.pipeline_parallel_size or any(not isinstance(p, int) or p < 1 for p in parts):
                raise ValueError(
                    f"pp_layer_partition={parts!r} must list {self.pipeline_parallel_size} positive layer counts, "
                    f"one per pipeline stage (--pp-layer-partition 10,14 for -pp 2)"
                )
            self.pp_layer_partition = parts
        self.eplb = EPLBConfig.from_value(self.eplb)
        if self.enable_eplb and not self.enable_expert_parallel and self.eplb.num_redundant_experts == 0 and self.world_size > 1:
            raise ValueError("--enable-eplb balances experts across expert-parallel ranks; add --enable-expert-parallel")
        if self.expert_data_parallel and self.pipeline_parallel_size > 1:
            raise ValueError(
                "--enable-expert-parallel with -dp above 1 spreads experts over the data-parallel engines, which step "
                "together; it does not combine with -pp above 1 (use -tp for the rest)"
            )
        if self.distributed_executor_backend is None:
            self.distributed_executor_backend = "uniproc" if self.world_size == 1 else "mp"
        elif self.distributed_executor_backend == "uniproc" and self.world_size > 1:
            raise ValueError(
                f"distributed_executor_backend='uniproc' runs one worker, but tensor_parallel_size x "
                f"pipeline_parallel_size = {self.world_size}; use --distributed-executor-backend mp (or ray)"
            )

    @property
    def world_size(self) -> int:
        """Worker ranks of one engine: tensor x pipeline parallel size."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def expert_data_parallel(self) -> bool:
        """``-dp N --enable-expert-parallel`` (N > 1): the experts spread over every engine's ranks,
        whose workers then form one ``torch.distributed`` world and whose engines step together."""
        return self.enable_expert_parallel and self.data_parallel_size > 1

    @property
    def distributed_world_size(self) -> int:
        """Ranks of the ``torch.distributed`` world a worker joins: its engine's, or every
        engine's with :attr:`expert_data_parallel`."""
        return self.world_size * (self.data_parallel_size if self.expert_data_parallel else 1)
