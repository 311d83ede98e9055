"""Executor base class: how the engine core drives its worker(s)."""

from __future__ import annotations

from typing import Any, ClassVar


class Executor:
    """Owns the workers of one engine and forwards calls to them.

    ``collective_rpc`` is the one primitive: call a worker method on every worker and collect the
    results. Everything else (``execute_model``, ``initialize_kv_cache``...) is built on it.
    """

    name: ClassVar[str] = ""
    max_concurrent_batches: ClassVar[int] = 1

    def __init__(self, config: Any) -> None:
        self.config = config
        self._init_executor()

    def _init_executor(self) -> None:
        """Start the workers and load the model on them."""
        raise NotImplementedError

    def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None) -> list[Any]:
        """Run ``method(*args, **kwargs)`` on every worker; return their results in rank order."""
        raise NotImplementedError

    def determine_available_memory(self) -> int:
        """Bytes each worker can give to the KV cache (the minimum over workers)."""
        return min(self.collective_rpc("determine_available_memory"))

    def initialize_kv_cache(self, kv_cache_config: Any) -> None:
        self.collective_rpc("initialize_kv_cache", (kv_cache_config,))

    def execute_model(self, scheduler_output: Any, non_blocking: bool = False) -> Any:
        """Run one step; the output of the driver worker (rank 0). With ``non_blocking`` the
        step is launched and a handle returned whose ``get_output()`` waits for the output
        (asynchronous scheduling); a finished ``ModelRunnerOutput`` is such a handle too."""
        return self.collective_rpc("execute_model", (scheduler_output,), {"non_blocking": non_blocking})[0]

    def check_health(self) -> None:
        """Raise if a worker is gone."""

    def shutdown(self) -> None:
        """Stop the workers; safe to call twice."""
