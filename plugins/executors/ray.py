"""The Ray executor (entry point ``host.executors: ray``; ``--distributed-executor-backend ray``):
the engine's workers as Ray actors, one per rank, in a placement group.

Needs Ray (``pip install host[ray]``); without it choosing this executor is an ``ImportError``
naming that command. Ray is imported on first use only, so having this plugin registered costs
nothing.

The cluster: with Ray already initialized in this process it is used as it is; with
``RAY_ADDRESS`` set, or a cluster running on this machine (``ray start --head``), this process
connects to it; otherwise it starts a local one-machine cluster (no dashboard)
and stops it again at :meth:`~RayExecutor.shutdown` — or, if this process is killed, a small reaper
process does (Ray's node agents would outlive it).

Placement: one bundle per rank (``{"CPU": 1}`` on the CPU platform, ``{<platform.ray_device_key>:
1, "CPU": 1}`` on an accelerator), strategy ``PACK``, and bundle 0 pinned to the node this
(the engine) process runs on. The group must be ready within ``HOST_RAY_PG_TIMEOUT`` seconds
(default 60), else a ``RuntimeError`` says what the cluster lacks and what to check.

The actors: each one, in its ``__init__``, bootstraps host's plugin host for the ``worker`` role —
the worker entry-point groups (general, platforms, attention backends, quantization, KV
connectors) loaded by the actor itself, so an out-of-tree model or platform registered by an
entry point is known in every Ray worker (vLLM's "Ray workers do not know my model", #5657). The
engine's plugin settings (``HOST_PLUGINS``, ``HOST_BLOCK_PLUGINS``...), every other ``HOST_*``
variable and the platform's ``additional_env_vars`` go to each actor's constructor, which sets
them before its plugin host (or torch) reads any (not Ray's ``runtime_env``: a job's own runtime
environment stays the user's, and no runtime-env agent is needed). Then one long call per actor runs host's worker loop (``host.sdk.distributed``),
the same code the ``mp`` workers run, reading the same shared-memory step broadcast and replying
on the same response queue (:class:`~host.plugins.executors.common.BroadcastExecutor`). The
shared-memory broadcast needs every actor on the engine's machine: an actor placed on another
node is refused with a ``RuntimeError`` (see docs/distributed.md, "Ray").

Failure: a monitor thread waits on the actors' long calls; one that ends while the executor is
running (the actor was killed, its process died, the loop raised) fails the executor within a
fraction of a second — every waiting and later call raises a ``RuntimeError`` naming the rank,
its pid and Ray's reason — and the other actors are killed, so nothing is left behind.

Shutdown (:meth:`RayExecutor.shutdown`, or the executor collected without it: its engine deleted):
the worker loops get the shutdown message and return, then every actor is killed, the placement
group removed — and waited for until the cluster reports it ``REMOVED`` (at most a few seconds), so
a next engine in the same process gets its bundles at once — and a local cluster this executor
started is stopped. :class:`RayHold` is what it gives back.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
import weakref
from typing import Any, Callable

from host.plugins.executors.common import BroadcastExecutor
from host.sdk import hookimpl

logger = logging.getLogger("host.executor.ray")

ENV_PG_TIMEOUT = "HOST_RAY_PG_TIMEOUT"
DEFAULT_PG_TIMEOUT_S = 60.0
HEALTH_TIMEOUT_S = 10.0
HEALTH_INTERVAL_S = 5.0
STOP_GRACE_S = 5.0  # after the shutdown message, for the worker loops to return
RELEASE_WAIT_S = 5.0  # for the cluster to report the placement group removed
INSTALL_HINT = "pip install host[ray]"


def import_ray() -> Any:
    """The ``ray`` module, or an ``ImportError`` naming how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            f"distributed_executor_backend='ray' needs Ray, which is not installed ({exc}); "
            f"install it with `{INSTALL_HINT}` (or pick --distributed-executor-backend mp)"
        ) from exc
    return ray


def worker_env(settings_env: dict[str, str], platform: Any) -> dict[str, str]:
    """The variables every actor gets: this process's ``HOST_*`` ones, the plugin settings the
    engine resolved (which may come from flags, not variables), the platform's extra variables."""
    env = {k: v for k, v in os.environ.items() if k.startswith("HOST_")}
    env.update(settings_env)
    for name in getattr(platform, "additional_env_vars", []):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def connect(ray: Any, num_cpus: int | None) -> bool:
    """Make sure this process is a Ray driver; ``True`` when it connected or started a cluster
    here (and so disconnects at shutdown), ``False`` when Ray was already initialized."""
    if ray.is_initialized():
        return False
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True)
        return True
    try:
        ray.init(address="auto", log_to_driver=True)
        return True
    except ConnectionError:
        pass
    logger.info("no Ray cluster to connect to: starting a local one on this machine")
    before = _descendants(os.getpid())
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=True)
    _start_reaper(sorted(_descendants(os.getpid()) - before))
    return True


# -- a local cluster dies with the engine ------------------------------------------------------------
# Ray's head processes share the fate of the process that started them, but its per-node agents
# (dashboard agent, runtime-env agent) outlive a SIGKILLed engine. A small process of its own
# (its own session, so it outlives the engine) waits for the engine to go away and kills the cluster
# processes the engine started, unless the engine said it stopped them itself.

_REAPER = """
import os, signal, sys
pids = [int(p) for p in sys.argv[1:]]
if sys.stdin.read().strip() != "stopped":
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"ray" not in fh.read():
                    continue
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
"""
_reaper: Any = None


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (Linux ``/proc``; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return set()
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _start_reaper(pids: list[int]) -> None:
    global _reaper
    if not pids or not sys.platform.startswith("linux"):
        return
    _reaper = subprocess.Popen(
        [sys.executable, "-c", _REAPER, *map(str, pids)], stdin=subprocess.PIPE, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def _stop_reaper() -> None:
    """The engine stopped its local cluster itself: the reaper leaves without killing."""
    global _reaper
    if _reaper is not None:
        try:
            _reaper.communicate(b"stopped", timeout=5)
        except Exception:  # noqa: BLE001 - it only ever kills Ray processes of ours
            _reaper.kill()
        _reaper = None


def driver_node(ray: Any) -> tuple[str, str]:
    """``(node_id, node_ip)`` of the Ray node this process runs on."""
    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            return node_id, node["NodeManagerAddress"]
    raise RuntimeError(f"this process's Ray node {node_id} is not among the cluster's nodes ({ray.nodes()})")


def bundles_for(world_size: int, platform: Any, driver_ip: str) -> list[dict[str, float]]:
    """One bundle per rank, bundle 0 pinned to the driver's node (by its ``node:<ip>`` resource)."""
    if platform.device_type == "cpu":
        bundle = {"CPU": 1.0}
    else:
        key = getattr(platform, "ray_device_key", "")
        if not key:
            raise ValueError(
                f"the {platform.name} platform names no Ray resource (Platform.ray_device_key is empty), so the "
                "Ray executor cannot place its workers; use --distributed-executor-backend mp"
            )
        bundle = {key: 1.0, "CPU": 1.0}
    bundles = [dict(bundle) for _ in range(world_size)]
    bundles[0][f"node:{driver_ip}"] = 0.001
    return bundles


def wait_for_placement_group(ray: Any, pg: Any, bundles: list[dict[str, float]], driver_ip: str, timeout: float) -> None:
    """Wait until ``pg`` is placed; after ``timeout`` seconds a ``RuntimeError`` with what to check."""
    ready, _ = ray.wait([pg.ready()], timeout=timeout)
    if ready:
        return
    need: dict[str, float] = {}
    for bundle in bundles:
        for key, amount in bundle.items():
            if not key.startswith("node:"):
                need[key] = need.get(key, 0.0) + amount
    raise RuntimeError(
        f"the Ray placement group of {len(bundles)} bundles {bundles[0]} (strategy PACK, bundle 0 on this node, "
        f"{driver_ip}) was not placed within {timeout:.0f} s. The cluster has {ray.cluster_resources()} "
        f"(available: {ray.available_resources()}); the workers need {need} in all. Check `ray status`: enough "
        f"free resources, and a Ray node on this machine's address {driver_ip} (start it with "
        f"`ray start --head --node-ip-address {driver_ip}`); raise {ENV_PG_TIMEOUT} to wait longer"
    )


class RayWorker:
    """The actor of one rank (wrapped with ``ray.remote`` by the executor).

    ``__init__`` bootstraps the ``worker`` plugin groups in the actor's own process; :meth:`run`
    is the worker loop (it blocks for the worker's life, so the actor runs two threads and
    :meth:`ping` still answers)."""

    def __init__(self, env: dict[str, str]) -> None:
        os.environ.update(env)  # before host's plugin host (or torch) reads any of it
        from host.sdk.runtime import get_plugin_host

        get_plugin_host().bootstrap("worker")

    def where(self) -> dict[str, Any]:
        import ray

        context = ray.get_runtime_context()
        return {"pid": os.getpid(), "node_id": context.get_node_id(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}

    def ping(self) -> int:
        return os.getpid()

    def plugin_records(self) -> list[dict[str, Any]]:
        """This actor's plugin records (what its own bootstrap loaded), before or during the loop."""
        from host.sdk.runtime import get_plugin_host

        return [dict(r.to_dict(), process_pid=os.getpid()) for r in get_plugin_host().list_records()]

    def run(self, config: Any, rank: int, local_rank: int, broadcast: Any, responses: Any) -> None:
        from host.sdk.distributed import run_worker

        run_worker(config, rank, local_rank, broadcast, responses)


class RayHold:
    """What one Ray executor holds in the cluster: its actors, its placement group, and the local
    cluster when it started one. :meth:`release` gives all of it back; it references no executor,
    so it runs from the executor's finalizer as well as from :meth:`RayExecutor.shutdown`."""

    def __init__(self, ray: Any) -> None:
        self.ray = ray
        self.actors: list[Any] = []
        self.pg: Any = None
        self.owns_ray = False

    def kill_actors(self) -> None:
        """Kill every actor (at once: Ray ends its process, running call or not)."""
        for actor in self.actors:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone, or the cluster is
                pass

    def release(self, wait_s: float = RELEASE_WAIT_S) -> None:
        """Kill the actors, remove the placement group and wait (at most ``wait_s``) until the
        cluster reports it removed, so its resources are free for the next engine when this
        returns; then stop the local cluster if this executor started it. Idempotent; a cluster
        that is already gone (``ray.shutdown()`` ran first) is no error."""
        ray = self.ray
        if not ray.is_initialized():
            if self.owns_ray:
                _stop_reaper()
            self.actors, self.pg, self.owns_ray = [], None, False
            return
        self.kill_actors()
        self.actors = []
        pg, self.pg = self.pg, None
        if pg is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(pg)
                deadline = time.monotonic() + wait_s
                while ray.util.placement_group_table(pg).get("state") != "REMOVED" and time.monotonic() < deadline:
                    time.sleep(0.02)
            except Exception:  # noqa: BLE001 - the cluster may be going away
                pass
        if self.owns_ray:
            self.owns_ray = False
            ray.shutdown()
            _stop_reaper()


class RayExecutor(BroadcastExecutor):
    """Ray actors as the engine's workers (see the module docstring)."""

    name = "ray"

    def _init_executor(self) -> None:
        self._ray = import_ray()  # before any queue or process exists
        self._stopping = False
        super()._init_executor()

    def _releaser(self) -> Callable[[], None]:
        self.hold = RayHold(self._ray)  # filled by _start_workers
        return self.hold.release

    @property
    def actors(self) -> list[Any]:
        return self.hold.actors

    def _start_workers(self, broadcast: Any, responses: Any) -> None:
        from host.sdk.runtime import current_platform, get_plugin_host

        ray = self._ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        start = time.monotonic()
        platform = current_platform()
        hold = self.hold
        self.pids: list[int] = []
        self._run_refs: list[Any] = []
        self._last_ping = 0.0
        hold.owns_ray = connect(ray, max(os.cpu_count() or 1, self.world_size) if platform.device_type == "cpu" else None)
        node_id, driver_ip = driver_node(ray)
        bundles = bundles_for(self.world_size, platform, driver_ip)
        hold.pg = placement_group(bundles, strategy="PACK")
        timeout = float(os.environ.get(ENV_PG_TIMEOUT, DEFAULT_PG_TIMEOUT_S))
        wait_for_placement_group(ray, hold.pg, bundles, driver_ip, timeout)
        logger.info("Ray placement group of %d bundles ready (%.1f s)", len(bundles), time.monotonic() - start)

        env = worker_env(get_plugin_host().settings.to_env(), platform)
        gpus = 0 if platform.device_type == "cpu" else 1
        actor_cls = ray.remote(RayWorker)
        for rank in range(self.world_size):
            strategy = PlacementGroupSchedulingStrategy(placement_group=hold.pg, placement_group_bundle_index=rank)
            hold.actors.append(actor_cls.options(
                num_cpus=1, num_gpus=gpus, max_concurrency=2, max_restarts=0, scheduling_strategy=strategy,
            ).remote(env))
        try:
            where = ray.get([a.where.remote() for a in hold.actors], timeout=self.ready_timeout_s)
        except Exception as exc:  # noqa: BLE001 - an actor's __init__ (the plugin bootstrap) failed, or timed out
            raise RuntimeError(
                f"a Ray worker actor did not start (its plugin bootstrap for the worker role failed, or it got no "
                f"process within {self.ready_timeout_s:.0f} s): {type(exc).__name__}: {exc}"
            ) from exc
        self.pids = [w["pid"] for w in where]
        logger.info("Ray worker actors up, pids %s (%.1f s)", self.pids, time.monotonic() - start)
        away = [(rank, w["node_id"]) for rank, w in enumerate(where) if w["node_id"] != node_id]
        if away:
            raise RuntimeError(
                f"Ray placed worker rank(s) {[r for r, _ in away]} on other nodes ({sorted({n for _, n in away})}) than "
                f"this engine's ({node_id}, {driver_ip}); host's step broadcast is shared memory, so every rank of one "
                f"engine must run on this machine: give this node {self.world_size} x {bundles[-1]} free"
            )
        # every rank on this node: the CPU ranks are local ranks 0..W-1; on an accelerator Ray makes
        # only the actor's own device visible to it, so its local device is 0
        local_ranks = list(range(self.world_size)) if gpus == 0 else [0] * self.world_size
        for rank, actor in enumerate(hold.actors):
            self._run_refs.append(actor.run.remote(self.config, rank, local_ranks[rank], broadcast, responses))
        self._monitor = threading.Thread(
            target=_watch_actors, args=(weakref.ref(self), ray, list(self._run_refs)), name="host-ray-monitor", daemon=True,
        )
        self._monitor.start()

    def _actor_ended(self, ref: Any) -> None:
        """From the monitor: the worker loop of ``ref``'s actor ended while it should be running."""
        rank = self._run_refs.index(ref)
        try:
            self._ray.get(ref)
            why = "its worker loop returned before the engine asked it to stop"
        except Exception as exc:  # noqa: BLE001 - Ray's reason goes into the message
            why = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}"
        if self._stopping:
            return
        self.fail(
            f"Ray actor of worker rank {rank} (pid {self.pids[rank]}) died: {why}; the engine stops its other "
            "workers and fails its requests (restart it; the actor's log is in the Ray session's logs)"
        )
        self.hold.kill_actors()

    def check_health(self) -> None:
        """Raise if the executor failed; every ``HEALTH_INTERVAL_S`` (the engine calls this every
        loop) also ping each actor, which must answer within ``HEALTH_TIMEOUT_S``."""
        super().check_health()
        now = time.monotonic()
        if now - self._last_ping < HEALTH_INTERVAL_S:
            return
        self._last_ping = now
        try:
            self._ray.get([a.ping.remote() for a in self.actors], timeout=HEALTH_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - any failure of a ping is an unhealthy worker
            self.fail(f"a Ray worker actor did not answer a ping within {HEALTH_TIMEOUT_S:.0f} s: {type(exc).__name__}: {exc}")
            self.hold.kill_actors()
            super().check_health()

    def shutdown(self) -> None:
        self._stopping = True  # before the loops see the shutdown message: their ends are no death
        super().shutdown()

    def _stop_workers(self) -> None:
        self._stopping = True
        run_refs = getattr(self, "_run_refs", [])
        if run_refs and self.failure is None and self.worker_info:  # the loops got the shutdown message
            try:
                self._ray.wait(run_refs, num_returns=len(run_refs), timeout=STOP_GRACE_S)
            except Exception:  # noqa: BLE001 - the cluster is gone: nothing to wait for
                pass
        monitor = getattr(self, "_monitor", None)
        if monitor is not None and monitor is not threading.current_thread():
            monitor.join(timeout=2.0)


def _watch_actors(executor_ref: "weakref.ref[RayExecutor]", ray: Any, refs: list[Any]) -> None:
    """Fail the executor when an actor's worker loop ends while it should be running. Holds the
    executor weakly between polls, so an executor nobody else holds is collected (its finalizer
    kills the actors, which ends this)."""
    while refs:
        executor = executor_ref()
        if executor is None or executor._stopping:
            return
        del executor
        try:
            done, refs = ray.wait(refs, num_returns=1, timeout=0.5)
        except Exception:  # noqa: BLE001 - the cluster went away (ray.shutdown)
            return
        if not done:
            continue
        executor = executor_ref()
        if executor is None or executor._stopping:
            return
        executor._actor_ended(done[0])
        return


@hookimpl
def host_register_executors(register: Callable[..., None]) -> None:
    register(RayExecutor)
