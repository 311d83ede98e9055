"""The uniproc executor (entry point ``host.executors: uniproc``): one worker, in the engine
process itself. The default for a single device, and what the CPU platform uses."""

from __future__ import annotations

from typing import Any, Callable

from host.sdk import Executor, hookimpl


class UniprocExecutor(Executor):
    """Runs the platform's worker class in this process; ``collective_rpc`` is a method call."""

    name = "uniproc"

    def _init_executor(self) -> None:
        from host.sdk.runtime import current_platform, resolve_qualname

        platform = current_platform()
        worker_cls = resolve_qualname(platform.worker_cls)
        self.worker = worker_cls(self.config, rank=0, local_rank=0, platform=platform)
        self.worker.init_device()
        self.worker.load_model()

    def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None) -> list[Any]:
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]

    def shutdown(self) -> None:
        worker = getattr(self, "worker", None)
        if worker is not None:
            worker.shutdown()
            self.worker = None


@hookimpl
def host_register_executors(register: Callable[..., None]) -> None:
    register(UniprocExecutor)
