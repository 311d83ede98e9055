"""The data-parallel engine-core clients: ``-dp N`` engine-core processes behind one front end.

:class:`DPAsyncMPClient` has :class:`~host.core.engine.client.AsyncMPClient`'s interface, so
:class:`~host.core.frontend.async_llm.AsyncLLM` (``host serve``) drives N engines as it drives
one; :class:`DPSyncMPClient` has :class:`~host.core.engine.client.SyncMPClient`'s, for the
offline :class:`~host.core.frontend.llm.LLM`. Each engine is an ordinary engine-core process (one
single-engine client each) started with a copy of the config whose ``parallel.data_parallel_rank``
is its index; with ``-tp``/``-pp`` each starts its own workers.

- **Routing.** A new engine request goes to the engine with the fewest unfinished requests
  routed to it (running + waiting in that engine, plus any still on their way); ties go to the
  lowest index. A request stays on its engine for its whole life: its aborts go there, and its
  entry is dropped once its last output (or its abort) has passed.
- **Outputs.** One task per engine moves that engine's :class:`EngineCoreOutputs` into one
  queue, read by :meth:`get_output_async`; each carries its ``engine_index`` (set by the engine
  process), which the stat loggers label ``/metrics`` with.
- **Utility calls** (:data:`UTILITY_POLICY`): what describes the deployment (``plugins``,
  ``describe``) is asked of engine 0; ``reset_prefix_cache`` and ``stats`` go to every engine
  and are combined (every cache reset; the stats summed); any other method goes to every engine
  and returns one result per engine, in engine order (:meth:`utility_all_async` does that for
  any method).
- **Failure.** The engines serve as one deployment: when any engine process dies the client is
  dead (``is_alive`` false, so ``/health`` answers 503), every waiter and every later call raises
  :class:`EngineDeadError` naming the engine, and the surviving engines stay up until
  :meth:`shutdown_async`.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import zmq

from host.contracts.messages import EngineCoreOutputs, EngineCoreRequest, SchedulerStats, from_engine_decoder
from host.core.engine.client import AsyncMPClient, EngineDeadError, EngineStartupError, SyncMPClient, next_output

logger = logging.getLogger("host.engine_client")


def _all_true(results: list[Any]) -> bool:
    return all(bool(r) for r in results)


def _merge(a: Any, b: Any) -> Any:
    """Two engines' values of one stats field as one: numbers summed, lists summed position by
    position (spec decode's per-position counts), dicts merged key by key (a KV connector's
    counters, the LoRA adapters' request counts), ``None`` taking the other side."""
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _merge(a.get(k), b.get(k)) for k in {**a, **b}}
    if isinstance(a, list) and isinstance(b, list):
        longer, shorter = (a, b) if len(a) >= len(b) else (b, a)
        return [x + (shorter[i] if i < len(shorter) else 0) for i, x in enumerate(longer)]
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a + b
    return a


def sum_stats(results: list[Any]) -> dict[str, Any]:
    """Several engines' :class:`SchedulerStats` (as objects or as the dicts the wire gives) as
    one: counts and totals summed (optional dict fields merged by :func:`_merge`),
    ``kv_cache_usage`` averaged, the hit rate recomputed."""
    rows = [r if isinstance(r, dict) else {f: getattr(r, f) for f in r.__struct_fields__} for r in results]
    defaults = SchedulerStats()
    out: dict[str, Any] = {f: getattr(defaults, f) for f in SchedulerStats.__struct_fields__}
    for row in rows:
        for key, value in row.items():
            out[key] = _merge(out.get(key), value)
    if rows:
        out["kv_cache_usage"] = (out.get("kv_cache_usage") or 0.0) / len(rows)
    queries = out.get("prefix_cache_queries", 0)
    out["prefix_cache_hit_rate"] = out.get("prefix_cache_hits", 0) / queries if queries else 0.0
    return out


ENGINE_0 = "engine 0"
UTILITY_POLICY: dict[str, str | Callable[[list[Any]], Any]] = {
    "plugins": ENGINE_0,  # every engine loads the same groups; /v1/plugins shows one engine process
    "describe": ENGINE_0,
    "reset_prefix_cache": _all_true,  # True only if every engine's cache was reset
    "stats": sum_stats,
}
"""How :meth:`DPAsyncMPClient.utility_async` answers a method: ``ENGINE_0`` asks engine 0 only;
a function gets every engine's result (in engine order) and combines them. A method not listed
goes to every engine and returns the list of their results."""


def engine_config(config: Any, rank: int) -> Any:
    """A copy of ``config`` for data-parallel engine ``rank`` (its own ``ParallelConfig``; each
    engine's executor picks its own ``distributed_init_method``)."""
    cfg = copy.copy(config)
    cfg.parallel = copy.copy(config.parallel)
    cfg.parallel.data_parallel_rank = rank
    if not cfg.parallel.expert_data_parallel:
        cfg.parallel.distributed_init_method = None
    return cfg


def share_expert_parallel_addresses(config: Any) -> None:
    """``-dp N --enable-expert-parallel``: one ``torch.distributed`` world for every engine's
    workers and one store where the engines agree on each step, at addresses chosen here once
    for all engines (free local ports)."""
    if not config.parallel.expert_data_parallel:
        return
    import socket

    def free_port() -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]

    config.parallel.distributed_init_method = f"tcp://127.0.0.1:{free_port()}"
    config.parallel.data_parallel_sync_addr = f"tcp://127.0.0.1:{free_port()}"


def _combine(method: str, results: list[Any]) -> Any:
    policy = UTILITY_POLICY.get(method)
    return results if policy is None else policy(results)


class _Router:
    """Which engine owns each unfinished request, and how many each owns."""

    def __init__(self, size: int) -> None:
        self.owner: dict[str, int] = {}
        self.load = [0] * size

    def route(self, request_id: str) -> int:
        """The least-loaded engine (the lowest index among equals), now owning ``request_id``."""
        index = min(range(len(self.load)), key=self.load.__getitem__)
        self.owner[request_id] = index
        self.load[index] += 1
        return index

    def release(self, request_id: str) -> int | None:
        """Forget a finished (or aborted) request; its engine, or ``None`` for an unknown id."""
        index = self.owner.pop(request_id, None)
        if index is not None:
            self.load[index] -= 1
        return index

    def release_finished(self, outputs: EngineCoreOutputs) -> EngineCoreOutputs:
        for out in outputs.outputs:
            if out.finished:
                self.release(out.req_id)
        return outputs

    def split(self, request_ids: list[str]) -> dict[int, list[str]]:
        """Release ``request_ids`` (an abort), grouped by the engine that owned them."""
        by_engine: dict[int, list[str]] = {}
        for rid in request_ids:
            index = self.release(rid)
            if index is not None:
                by_engine.setdefault(index, []).append(rid)
        return by_engine


class DPAsyncMPClient:
    """``data_parallel_size`` engine-core processes behind one asyncio front end (see the module
    docstring); same calls as :class:`AsyncMPClient`."""

    def __init__(self, engines: list[AsyncMPClient]) -> None:
        self.engines = engines
        self.engine_info: dict[str, Any] = dict(
            engines[0].engine_info, data_parallel_size=len(engines), engine_pids=self.engine_pids,
        )
        self._outputs: asyncio.Queue[EngineCoreOutputs | BaseException] = asyncio.Queue()
        self._router = _Router(len(engines))
        self.dead_reason: str | None = None
        self._closed = False
        self._tasks = [asyncio.create_task(self._pump(i)) for i in range(len(engines))]

    @classmethod
    async def start(cls, config: Any, startup_timeout: float = 600.0) -> "DPAsyncMPClient":
        """Start ``config.parallel.data_parallel_size`` engine processes at once and wait until
        all are up; if one fails, the others are stopped and :class:`EngineStartupError` names it."""
        size = config.parallel.data_parallel_size
        share_expert_parallel_addresses(config)
        started = await asyncio.gather(
            *(AsyncMPClient.start(engine_config(config, rank), startup_timeout) for rank in range(size)),
            return_exceptions=True,
        )
        failed = [(rank, r) for rank, r in enumerate(started) if isinstance(r, BaseException)]
        if failed:
            await asyncio.gather(*(r.shutdown_async() for r in started if isinstance(r, AsyncMPClient)))
            rank, exc = failed[0]
            raise EngineStartupError(f"data-parallel engine {rank} of {size} failed to start: {exc}") from exc
        client = cls(list(started))
        logger.info("data parallel: %d engines up, pids %s", size, client.engine_pids)
        return client

    # -- health (AsyncMPClient's properties) ----------------------------------------------------
    @property
    def is_alive(self) -> bool:
        return self.dead_reason is None and all(e.is_alive for e in self.engines)

    @property
    def engine_pid(self) -> int:
        """Engine 0's pid (the process ``/v1/plugins`` describes)."""
        return self.engines[0].engine_pid

    @property
    def engine_pids(self) -> list[int]:
        return [e.engine_pid for e in self.engines]

    @property
    def silent_for(self) -> float:
        """The longest silence among the engines (one wedged engine makes ``/health`` 503)."""
        return max(e.silent_for for e in self.engines)

    def load(self) -> list[int]:
        """Unfinished requests routed to each engine, in engine order."""
        return list(self._router.load)

    def _fail(self, reason: str) -> None:
        if self.dead_reason is None:
            self.dead_reason = reason
            logger.error("data-parallel engine failed: %s", reason)
        self._outputs.put_nowait(EngineDeadError(reason))

    async def _pump(self, index: int) -> None:
        engine = self.engines[index]
        try:
            while True:
                self._outputs.put_nowait(self._router.release_finished(await engine.get_output_async()))
        except EngineDeadError as exc:
            if not self._closed:
                self._fail(f"data-parallel engine {index} of {len(self.engines)} (pid {engine.engine_pid}): {exc}")

    # -- requests -------------------------------------------------------------------------------
    def _check_alive(self) -> None:
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)

    async def add_request_async(self, request: EngineCoreRequest) -> None:
        """Send ``request`` to the least-loaded engine, which keeps it for its whole life."""
        self._check_alive()
        index = self._router.route(request.request_id)
        try:
            await self.engines[index].add_request_async(request)
        except BaseException:
            self._router.release(request.request_id)
            raise

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        """Abort each request on the engine that owns it (unknown or finished ids are ignored)."""
        by_engine = self._router.split(request_ids)
        if self.dead_reason is None and not self._closed:
            await asyncio.gather(*(self.engines[i].abort_requests_async(ids) for i, ids in by_engine.items()))

    async def get_output_async(self) -> EngineCoreOutputs:
        """The next outputs of any engine; raises :class:`EngineDeadError` once one is gone."""
        return await next_output(self._outputs)

    async def utility_all_async(self, method: str, *args: Any, timeout: float = 30.0) -> list[Any]:
        """``EngineCore.utility_<method>(*args)`` in every engine: their results, in engine order."""
        self._check_alive()
        return list(await asyncio.gather(*(e.utility_async(method, *args, timeout=timeout) for e in self.engines)))

    async def utility_async(self, method: str, *args: Any, timeout: float = 30.0) -> Any:
        """A utility call, sent and answered as :data:`UTILITY_POLICY` says for ``method``."""
        if UTILITY_POLICY.get(method) == ENGINE_0:
            self._check_alive()
            return await self.engines[0].utility_async(method, *args, timeout=timeout)
        return _combine(method, await self.utility_all_async(method, *args, timeout=timeout))

    async def shutdown_async(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.gather(*(e.shutdown_async() for e in self.engines))
        for task in self._tasks:
            task.cancel()


class DPSyncMPClient:
    """``data_parallel_size`` engine-core processes for the offline :class:`LLM`, driven with
    blocking calls; same calls as :class:`SyncMPClient` (routing, utility calls and failure as in
    the module docstring: a dead engine raises :class:`EngineDeadError` naming it)."""

    def __init__(self, config: Any, startup_timeout: float = 600.0) -> None:
        size = config.parallel.data_parallel_size
        share_expert_parallel_addresses(config)
        with ThreadPoolExecutor(size, thread_name_prefix="host-dp-start") as pool:  # the engines start at once
            futures = [pool.submit(SyncMPClient, engine_config(config, rank), startup_timeout) for rank in range(size)]
        started = [f.result() for f in futures if f.exception() is None]
        failed = [(rank, f.exception()) for rank, f in enumerate(futures) if f.exception() is not None]
        if failed:
            for engine in started:
                engine.shutdown()
            rank, exc = failed[0]
            raise EngineStartupError(f"data-parallel engine {rank} of {size} failed to start: {exc}") from exc
        self.engines = started
        self.engine_info: dict[str, Any] = dict(
            started[0].engine_info, data_parallel_size=size, engine_pids=[e.engine_info.get("pid") for e in started],
        )
        self._router = _Router(size)
        self._poller = zmq.Poller()
        for engine in started:
            self._poller.register(engine._from_engine, zmq.POLLIN)
        self._next = 0  # where the next look for outputs starts: no engine's outputs wait behind another's

    def load(self) -> list[int]:
        return list(self._router.load)

    def _check_alive(self) -> None:
        for index, engine in enumerate(self.engines):
            reason = engine._proc.dead_reason()
            if reason is not None:
                raise EngineDeadError(f"data-parallel engine {index} of {len(self.engines)}: {reason}")

    def add_request(self, request: EngineCoreRequest) -> None:
        self._check_alive()
        self.engines[self._router.route(request.request_id)].add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        for index, ids in self._router.split(request_ids).items():
            self.engines[index].abort_requests(ids)

    def _order(self) -> list[int]:
        n = len(self.engines)
        return [(self._next + k) % n for k in range(n)]

    def get_output(self) -> EngineCoreOutputs:
        """The next step's outputs of any engine (blocks until one arrives)."""
        while True:
            self._check_alive()
            for index in self._order():
                pending = self.engines[index]._pending  # steps read while a utility call waited
                if pending:
                    self._next = index + 1
                    return self._router.release_finished(pending.popleft())
            events = dict(self._poller.poll(200))
            for index in self._order():
                socket = self.engines[index]._from_engine
                if socket in events:
                    msg = from_engine_decoder.decode(socket.recv())
                    if msg.heartbeat or msg.utility is not None:  # a utility answer nobody waits for
                        continue
                    self._next = index + 1
                    return self._router.release_finished(msg)

    def utility(self, method: str, *args: Any) -> Any:
        """A utility call, sent and answered as :data:`UTILITY_POLICY` says for ``method``."""
        self._check_alive()
        if UTILITY_POLICY.get(method) == ENGINE_0:
            return self.engines[0].utility(method, *args)
        return _combine(method, [engine.utility(method, *args) for engine in self.engines])

    def shutdown(self) -> None:
        for engine in self.engines:
            engine.shutdown()


__all__ = ["DPAsyncMPClient", "DPSyncMPClient", "UTILITY_POLICY", "engine_config", "sum_stats"]
