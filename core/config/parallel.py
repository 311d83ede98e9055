"""How one model is spread over processes."""

from __future__ import annotations

from dataclasses import dataclass


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
    # set at start-up
    data_parallel_rank: int = 0
    distributed_init_method: str | None = None

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
