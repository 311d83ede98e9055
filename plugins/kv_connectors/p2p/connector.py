"""``p2p``: a consumer pulls a producer's KV blocks over TCP (the prefill/decode split, shaped
like vLLM's NIXL connector), both roles in one class.

Flow (vLLM's convention): a proxy sends the prompt to the producer with ``max_tokens=1`` and
``kv_transfer_params={"do_remote_decode": true}``. When it ends, the producer's scheduler role
keeps its blocks (``delay_free``) and returns ``{"do_remote_prefill": true, "remote_engine_id",
"remote_host", "remote_port", "remote_block_ids", "remote_request_id", "remote_num_tokens",
"tp_size"}``; the producer's workers lease the blocks. The proxy passes those params to the
consumer, whose scheduler role reports the prompt's tokens as an asynchronous external hit; its
workers handshake with the producer's (same rank, port ``remote_port + rank``), READ the
blocks into the request's local blocks in a background thread, heartbeat every pending
request, and say DONE. A lease ends on DONE or expiry, and the producer frees the blocks.

``kv_connector_extra_config`` keys: ``side_channel_host`` (127.0.0.1), ``side_channel_port``
(the base port; default ``http_port + 1000`` when the server's HTTP port is known, else a free
one chosen at start; worker rank ``r`` of data-parallel engine ``d`` listens on
``base + d * world_size + r``), ``kv_lease_duration`` (30 s), ``heartbeat_interval_s`` (a third
of the producer's lease), ``handshake_timeout_s`` (5 s), ``read_timeout_s`` (10 s),
``unknown_request_grace_s`` (how long a READ of a request the producer has not leased yet is
retried, 2 s), ``remote_engine_ttl_s`` (600 s; 0 keeps remote engines forever),
``enforce_compat_hash`` (true).

Every failure of a pull — dead port, timeout, compatibility mismatch, a restarted producer
(another engine id, or a request it does not know), a short read — is reported as a finished
and failed receive with the request's blocks as load errors: the host recomputes (or fails the
request, per ``kv_load_failure_policy``). A consumer never hangs or crashes on a producer.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from host.sdk.kv_connector import (
    KVConnector,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
)

from .client import call, send_all
from .handshake import Handshaker, compat_hash, compat_inputs
from .leases import LeaseTable
from .protocol import READ_REPLY_DECODER, Done, HandshakePayload, Heartbeat, Read, block_runs
from .remotes import RemoteEngines
from .side_channel import SideChannelServer
from .transfer import TransferHandle, pop_done_transfers

logger = logging.getLogger("host.kv_connectors.p2p")

HTTP_PORT_OFFSET = 1000
BASE_KEY = "_side_channel_base"  # the base port the scheduler role settled (workers read it)


@dataclass
class RecvSpec:
    req_id: str  # the local request
    remote_req_id: str
    local_block_ids: list[int]
    remote_block_ids: list[int]
    host: str
    port: int  # the producer's base port
    engine_id: str


@dataclass
class P2PMetadata(KVConnectorMetadata):
    recvs: list[RecvSpec] = field(default_factory=list)
    done_only: list[RecvSpec] = field(default_factory=list)  # a full local hit: only say DONE
    sends: dict[str, list[int]] = field(default_factory=dict)  # leases to start: req id -> blocks


def _free_ports(host: str, n: int) -> int:
    """A port p with p..p+n-1 free on ``host`` now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((host, 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        ok = True
        for p in range(base + 1, base + n):
            with socket.socket() as s:
                try:
                    s.bind((host, p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError(f"p2p KV connector: found no {n} consecutive free ports on {host}; set side_channel_port")


def side_channel_base(config: Any) -> int:
    """This engine's base side-channel port (rank r adds r); see the module docstring."""
    kv = config.kv_transfer
    extra = kv.extra
    if BASE_KEY in extra:
        return int(extra[BASE_KEY])
    world = config.parallel.world_size
    dp_offset = config.parallel.data_parallel_rank * world
    if extra.get("side_channel_port") is not None:
        return int(extra["side_channel_port"]) + dp_offset
    if kv.http_port:
        return int(kv.http_port) + HTTP_PORT_OFFSET + dp_offset
    return _free_ports(extra.get("side_channel_host", "127.0.0.1"), world)


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class P2PConnector(KVConnector):
    name = "p2p"

    def __init__(self, config: Any, role: KVConnectorRole) -> None:
        super().__init__(config, role)
        kv = config.kv_transfer
        self.kv = kv
        self.extra = kv.extra
        self.engine_id = kv.engine_id
        self.block_size = config.cache.block_size
        self.world_size = config.parallel.world_size
        self.host = str(self.extra.get("side_channel_host", "127.0.0.1"))
        self.lease_s = float(self.extra.get("kv_lease_duration", 30.0))
        self._lock = threading.Lock()
        if role == KVConnectorRole.SCHEDULER:
            self._init_scheduler()
        else:
            self._init_worker()

    # == scheduler role ==========================================================================
    def _init_scheduler(self) -> None:
        self.base_port = side_channel_base(self.config) if self.kv.is_kv_producer else None
        if self.base_port is not None:
            self.extra[BASE_KEY] = self.base_port  # before the workers start: they read it
        self._first_block: dict[str, int] = {}
        self._recvs: list[RecvSpec] = []
        self._done_only: list[RecvSpec] = []
        self._sends: dict[str, list[int]] = {}
        self._notified: set[str] = set()
        self._loaded: set[str] = set()  # asked their producer once already
        self._hits = 0

    @staticmethod
    def _remote(request: Any) -> dict[str, Any] | None:
        p = request.kv_transfer_params
        return p if isinstance(p, dict) and p.get("do_remote_prefill") else None

    def _spec(self, request: Any, p: dict[str, Any], local: list[int], remote: list[int]) -> RecvSpec | None:
        try:
            return RecvSpec(request.request_id, str(p.get("remote_request_id", request.request_id)), local, remote,
                            str(p["remote_host"]), int(p["remote_port"]), str(p["remote_engine_id"]))
        except (KeyError, TypeError, ValueError) as e:
            logger.warning("p2p KV connector: request %s has unusable kv_transfer_params %r (%s); computing its "
                           "prompt here", request.request_id, p, e)
            return None

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        p = self._remote(request) if self.kv.is_kv_consumer else None
        if p is None or request.request_id in self._loaded:
            return 0, False  # (a loaded request that was preempted recomputes: the producer let go)
        try:
            remote_tokens = int(p["remote_num_tokens"])
            if int(p.get("tp_size", 1)) != self.config.parallel.tensor_parallel_size:
                logger.error("p2p KV connector: request %s comes from a producer with tp_size=%s, this engine runs "
                             "-tp %d; the p2p connector needs the same -tp on both sides: computing its prompt here",
                             request.request_id, p.get("tp_size"), self.config.parallel.tensor_parallel_size)
                self._notify_done(request, p)
                return 0, False
        except (KeyError, TypeError, ValueError):
            self._spec(request, {}, [], [])  # logs why
            return 0, False
        n = remote_tokens - num_computed_tokens
        if n <= 0:  # everything already here: release the producer's blocks now
            self._notify_done(request, p)
            return 0, False
        self._first_block[request.request_id] = num_computed_tokens // self.block_size
        return n, True

    def _notify_done(self, request: Any, p: dict[str, Any]) -> None:
        if request.request_id in self._notified:
            return
        self._notified.add(request.request_id)
        spec = self._spec(request, p, [], [])
        if spec is not None:
            self._done_only.append(spec)

    def update_state_after_alloc(self, request: Any, block_ids: list[int], num_external_tokens: int) -> None:
        p = self._remote(request)
        if num_external_tokens <= 0 or p is None:
            return
        first = self._first_block.pop(request.request_id, 0)
        n = -(-(first * self.block_size + num_external_tokens) // self.block_size) - first
        remote_ids = list(p.get("remote_block_ids", []))[first:first + n]
        spec = self._spec(request, p, list(block_ids[first:first + n]), remote_ids)
        if spec is None or len(remote_ids) != n:
            # the worker reports it failed: the host recomputes (or fails it, per the policy)
            spec = spec or RecvSpec(request.request_id, request.request_id, list(block_ids[first:first + n]), [],
                                    "", 0, "")
            spec.remote_block_ids = []
        self._notified.add(request.request_id)
        self._loaded.add(request.request_id)
        self._recvs.append(spec)
        self._hits += num_external_tokens

    def build_connector_meta(self, scheduler_output: Any) -> P2PMetadata:
        meta = P2PMetadata(self._recvs, self._done_only, self._sends)
        self._recvs, self._done_only, self._sends = [], [], {}
        return meta

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._notified.discard(request.request_id)
        self._loaded.discard(request.request_id)
        self._first_block.pop(request.request_id, None)
        p = request.kv_transfer_params
        if not (self.kv.is_kv_producer and isinstance(p, dict) and p.get("do_remote_decode")):
            return False, None
        num_tokens = min(request.num_prompt_tokens, request.num_computed_tokens)
        status = getattr(request.status, "name", "")
        if not block_ids or num_tokens <= 0 or status == "FINISHED_ABORTED":
            return False, None  # nothing computed to hand off (queued, preempted, aborted)
        remote_ids = list(block_ids[: -(-num_tokens // self.block_size)])
        self._sends[request.request_id] = remote_ids
        return True, {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.engine_id,
            "remote_host": self.host,
            "remote_port": self.base_port,
            "remote_block_ids": remote_ids,
            "remote_request_id": request.request_id,
            "remote_num_tokens": num_tokens,
            "tp_size": self.config.parallel.tensor_parallel_size,
        }

    def get_stats(self) -> dict[str, int]:
        hits, self._hits = getattr(self, "_hits", 0), 0
        return {"external_hit_tokens": hits} if hits else {}

    # == worker role =============================================================================
    def _init_worker(self) -> None:
        self.rank = _rank()
        self.kv_caches: dict[str, torch.Tensor] = {}
        self.leases = LeaseTable(self.lease_s)
        self.server: SideChannelServer | None = None
        self.handshaker: Handshaker | None = None
        self.remotes = RemoteEngines(float(self.extra.get("remote_engine_ttl_s", 600.0)))
        self._handles: dict[str, TransferHandle] = {}
        self._pending: dict[str, RecvSpec] = {}  # heartbeat these
        self._invalid: set[int] = set()
        self._stats = {"load_bytes": 0, "save_bytes": 0, "failed_transfers": 0}
        self._readers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="p2p-read")
        self._stop = threading.Event()
        self._beater: threading.Thread | None = None
        self.handshake_timeout_s = float(self.extra.get("handshake_timeout_s", 5.0))
        self.read_timeout_s = float(self.extra.get("read_timeout_s", 10.0))
        self.unknown_grace_s = float(self.extra.get("unknown_request_grace_s", 2.0))

    def _count(self, key: str, n: int) -> None:
        with self._lock:
            self._stats[key] += n

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        self.kv_caches = dict(kv_caches)
        inputs = compat_inputs(self.config, self.kv_caches)
        if self.kv.is_kv_producer:
            self.port = side_channel_base(self.config) + self.rank
            first = next(iter(self.kv_caches.values()))
            payload = HandshakePayload(self.engine_id, compat_hash(inputs), inputs, self.lease_s, self.rank,
                                       self.world_size, list(self.kv_caches), int(first.shape[1]))
            self.server = SideChannelServer(self.host, self.port, payload, self.kv_caches, self.leases,
                                            on_sent=lambda n: self._count("save_bytes", n)).start()
            logger.info("p2p KV connector: rank %d serves its KV on %s:%d (engine %s)", self.rank, self.host,
                        self.port, self.engine_id)
        if self.kv.is_kv_consumer:
            self.handshaker = Handshaker(inputs, self.rank, self.world_size, self.handshake_timeout_s,
                                         enforce=bool(self.extra.get("enforce_compat_hash", True)))
            self._beater = threading.Thread(target=self._heartbeats, name="p2p-heartbeat", daemon=True)
            self._beater.start()

    def bind_connector_metadata(self, metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(metadata)
        if not isinstance(metadata, P2PMetadata):
            return
        for req_id, block_ids in metadata.sends.items():
            self.leases.start(req_id, block_ids)

    def start_load_kv(self, forward_context: Any) -> None:
        meta = self._metadata
        if not isinstance(meta, P2PMetadata):
            return
        for spec in meta.done_only:
            self._readers.submit(self._say_done, spec)
        for spec in meta.recvs:
            with self._lock:
                self._pending[spec.req_id] = spec
            self._handles[spec.req_id] = TransferHandle(spec.req_id, spec.engine_id, list(spec.local_block_ids),
                                                        self._readers.submit(self._pull, spec))

    def _busy(self) -> set[str]:
        return {h.engine_id for h in list(self._handles.values()) if not h.future.done()}

    def _pull(self, spec: RecvSpec) -> int:
        """One request's read (a reader thread): returns the bytes loaded; raises on failure."""
        try:
            if not spec.remote_block_ids:
                raise RuntimeError(f"request {spec.req_id!r}: kv_transfer_params name no (or too few) remote blocks")
            host, port = spec.host, spec.port + self.rank
            assert self.handshaker is not None
            payload = self.handshaker.get(host, port)
            if payload.engine_id != spec.engine_id:  # a stale handshake, or a restarted producer
                self.handshaker.forget(host, port)
                payload = self.handshaker.get(host, port)
                if payload.engine_id != spec.engine_id:
                    raise RuntimeError(
                        f"the producer at {host}:{port} is engine {payload.engine_id}, but request {spec.req_id!r}'s "
                        f"KV is on engine {spec.engine_id} (the producer restarted)")
            self.remotes.add(spec.engine_id, payload, self._busy() - {spec.engine_id})
            self.remotes.touch(spec.engine_id)
            loaded = self._read(host, port, spec)
            self._say_done(spec)
            return loaded
        finally:
            with self._lock:
                self._pending.pop(spec.req_id, None)

    def _read(self, host: str, port: int, spec: RecvSpec) -> int:
        deadline = time.monotonic() + self.unknown_grace_s
        while True:
            frames = call(host, port, Read(spec.engine_id, spec.remote_req_id, spec.remote_block_ids),
                          self.read_timeout_s)
            reply = READ_REPLY_DECODER.decode(frames[0].buffer)
            if reply.status == "unknown" and time.monotonic() < deadline and not self._stop.is_set():
                time.sleep(0.02)  # the producer's worker has not leased it yet
                continue
            if reply.status != "ok":
                raise RuntimeError(f"producer {host}:{port} refused READ of {spec.remote_req_id!r}: "
                                   f"{reply.status} ({reply.detail})")
            break
        runs = block_runs(spec.remote_block_ids)
        missing = [n for n in reply.layers if n not in self.kv_caches]
        want = len(reply.layers) * 2 * len(runs)
        if missing or len(frames) - 1 != want:
            raise RuntimeError(f"short or mismatched READ reply from {host}:{port}: {len(frames) - 1} frames for "
                               f"{want} expected, layers missing here: {missing}")
        total, i = 0, 1
        for name in reply.layers:
            kv = self.kv_caches[name]
            block_bytes = kv[0, 0].numel() * kv.element_size()
            for side in (0, 1):
                offset = 0
                for _, count in runs:
                    buf = frames[i].buffer
                    i += 1
                    if buf.nbytes != count * block_bytes:
                        raise RuntimeError(f"short READ from {host}:{port}: {buf.nbytes} bytes for {count} blocks "
                                           f"of {block_bytes} bytes (layer {name})")
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # a read-only buffer, only read from
                        src = torch.frombuffer(buf, dtype=torch.uint8).view(kv.dtype).view(count, *kv.shape[2:])
                    dst = torch.tensor(spec.local_block_ids[offset:offset + count], device=kv.device)
                    kv[side].index_copy_(0, dst, src.to(kv.device))
                    offset += count
                    total += buf.nbytes
        self._count("load_bytes", total)
        return total

    def _say_done(self, spec: RecvSpec) -> None:
        try:
            call(spec.host, spec.port + self.rank, Done(spec.remote_req_id), self.handshake_timeout_s)
        except Exception as e:  # the lease will expire on its own
            logger.info("p2p KV connector: DONE for %s to %s:%d failed (%s); its lease will expire",
                        spec.remote_req_id, spec.host, spec.port + self.rank, e)

    def _heartbeat_interval(self) -> float:
        if "heartbeat_interval_s" in self.extra:
            return float(self.extra["heartbeat_interval_s"])
        leases = [p.lease_s for p in list(self.remotes.info.values())]
        return min(leases, default=30.0) / 3

    def _heartbeats(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(0.02):
            if time.monotonic() - last < self._heartbeat_interval():
                continue
            last = time.monotonic()
            with self._lock:
                groups: dict[tuple[str, int], list[str]] = {}
                for spec in self._pending.values():
                    groups.setdefault((spec.host, spec.port + self.rank), []).append(spec.remote_req_id)
            if not groups:
                continue
            try:  # all producers at once: a dead one must not starve the others' leases
                answered = send_all({k: Heartbeat(ids) for k, ids in groups.items()},
                                    min(self.handshake_timeout_s, self._heartbeat_interval(), 1.0))
            except Exception as e:
                logger.debug("p2p heartbeats failed: %s", e)
                continue
            for host, port in set(groups) - answered:
                logger.debug("p2p heartbeat to %s:%d: no answer", host, port)

    def get_transfer_results(self) -> KVConnectorTransferResults:
        out = KVConnectorTransferResults()
        if self.server is not None:
            self.leases.reap()
            out.finished_sending = self.leases.take_finished()
        if self._handles:
            polled = pop_done_transfers(self._handles)
            out.finished_recving = set(polled.done) | set(polled.failed)
            out.failed_recving = set(polled.failed)
            for blocks in polled.failed.values():
                self._invalid.update(blocks)
            if polled.failed:
                self._count("failed_transfers", len(polled.failed))
        return out

    def get_block_ids_with_load_errors(self) -> set[int]:
        out, self._invalid = self._invalid, set()
        return out

    def get_worker_stats(self) -> dict[str, int]:
        with self._lock:
            out = {k: v for k, v in self._stats.items() if v}
            for k in self._stats:
                self._stats[k] = 0
        return out

    def shutdown(self) -> None:
        if self.role != KVConnectorRole.WORKER:
            return
        self._stop.set()
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.handshaker is not None:
            self.handshaker.shutdown()
        self._readers.shutdown(wait=True, cancel_futures=True)
        if self._beater is not None:
            self._beater.join(timeout=2)
