"""The producer worker's side-channel server: a ZMQ ROUTER socket in a thread that answers
GET_META (the handshake payload), READ (a leased request's blocks, every layer), HEARTBEAT
(extend leases) and DONE (release a lease).

READ sends each run of consecutive blocks of each layer's K and V as one frame straight from
the page tensor (a memoryview of the contiguous slice, no copy, on CPU; a device cache is
copied to host memory first). The blocks cannot change while they are sent: a leased request's
blocks stay with the connector until its lease ends (``delay_free``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

import msgspec
import torch
import zmq

from .leases import LeaseTable
from .protocol import ENCODER, MESSAGE_DECODER, Ack, Done, GetMeta, HandshakePayload, Heartbeat, Read, ReadReply, block_runs

logger = logging.getLogger("host.kv_connectors.p2p")

POLL_MS = 50


def frame_of(t: torch.Tensor) -> Any:
    """The bytes of a tensor slice as a buffer zmq sends without copying (CPU, contiguous), or
    a host copy."""
    if t.device.type != "cpu":
        t = t.to("cpu")
    if not t.is_contiguous():
        t = t.contiguous()
    return memoryview(t.view(torch.uint8).numpy()).cast("B")


class SideChannelServer:
    """Serves one worker's KV cache; started by :meth:`start`, stopped by :meth:`stop`."""

    def __init__(self, host: str, port: int, payload: HandshakePayload, kv_caches: dict[str, torch.Tensor],
                 leases: LeaseTable, on_sent: Callable[[int], None] = lambda n: None) -> None:
        self.host, self.port = host, port
        self.payload = payload
        self.kv_caches = kv_caches
        self.leases = leases
        self.on_sent = on_sent
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            self._sock.bind(f"tcp://{host}:{port}")
        except zmq.ZMQError as e:
            self._sock.close()
            self._ctx.term()
            raise RuntimeError(
                f"p2p KV connector: cannot bind the side channel on {host}:{port} ({e}); set "
                "kv_connector_extra_config side_channel_port to a free port (or leave it unset: it is derived "
                "from the HTTP port, or a free one is chosen)") from None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"p2p-side-channel-{port}", daemon=True)

    def start(self) -> "SideChannelServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._sock.close()
        self._ctx.term()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(POLL_MS):
                continue
            ident, _, body = self._sock.recv_multipart()
            try:
                reply = self._handle(MESSAGE_DECODER.decode(body))
            except msgspec.DecodeError as e:
                reply = [ENCODER.encode(Ack(ok=False, detail=f"undecodable message: {e}"))]
            except Exception as e:  # never let one bad request stop the server
                logger.exception("p2p side channel: request failed")
                reply = [ENCODER.encode(Ack(ok=False, detail=f"{type(e).__name__}: {e}"))]
            self._sock.send_multipart([ident, b"", *reply], copy=False)

    def _handle(self, msg: Any) -> list[Any]:
        if isinstance(msg, GetMeta):
            return [ENCODER.encode(self.payload)]
        if isinstance(msg, Heartbeat):
            self.leases.heartbeat(msg.req_ids)
            return [ENCODER.encode(Ack())]
        if isinstance(msg, Done):
            self.leases.done(msg.req_id)
            return [ENCODER.encode(Ack())]
        assert isinstance(msg, Read)
        return self._read(msg)

    def _read(self, msg: Read) -> list[Any]:
        if msg.engine_id != self.payload.engine_id:
            return [ENCODER.encode(ReadReply(
                "wrong_engine", f"this is engine {self.payload.engine_id}, not {msg.engine_id} (restarted?)"))]
        held = self.leases.blocks(msg.req_id)
        if held is None:
            reason = self.leases.released_reason(msg.req_id)
            status = "released" if reason else "unknown"
            return [ENCODER.encode(ReadReply(status, reason or f"no lease for request {msg.req_id!r}"))]
        if not set(msg.block_ids) <= set(held):
            return [ENCODER.encode(ReadReply(
                "bad_blocks", f"request {msg.req_id!r} holds blocks {held}, not all of {msg.block_ids}"))]
        frames: list[Any] = []
        runs = block_runs(msg.block_ids)
        for kv in self.kv_caches.values():
            for side in (0, 1):
                for first, count in runs:
                    frames.append(frame_of(kv[side, first:first + count]))
        self.on_sent(sum(f.nbytes for f in frames))
        return [ENCODER.encode(ReadReply("ok", layers=list(self.kv_caches))), *frames]
