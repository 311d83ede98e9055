"""One request/reply round trip to a producer's side channel, bounded by a receive timeout
(a dead or hung producer is a ``TimeoutError`` after ``timeout_s``, never a hang)."""

from __future__ import annotations

import time

import zmq

from .protocol import ENCODER

_CTX: zmq.Context | None = None


def context() -> zmq.Context:
    """This process's context for side-channel clients (its own: never the engine's)."""
    global _CTX
    if _CTX is None:
        _CTX = zmq.Context()
    return _CTX


def call(host: str, port: int, msg: object, timeout_s: float) -> list[zmq.Frame]:
    """Send ``msg`` and return the reply's frames (zero-copy ``zmq.Frame`` objects)."""
    sock = context().socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, max(1, int(timeout_s * 1000)))
    sock.setsockopt(zmq.SNDTIMEO, max(1, int(timeout_s * 1000)))
    try:
        sock.connect(f"tcp://{host}:{port}")
        sock.send(ENCODER.encode(msg))
        try:
            return sock.recv_multipart(copy=False)
        except zmq.Again:
            raise TimeoutError(
                f"p2p KV connector: no reply from the producer's side channel {host}:{port} within {timeout_s:g}s "
                "(dead or overloaded producer; handshake_timeout_s / read_timeout_s in kv_connector_extra_config)"
            ) from None
    finally:
        sock.close()


def send_all(targets: dict[tuple[str, int], object], timeout_s: float) -> set[tuple[str, int]]:
    """Send one message to each ``(host, port)`` at once and wait, together, at most
    ``timeout_s`` for the replies (a dead peer never delays the others' messages). Returns the
    targets that answered."""
    socks: dict[zmq.Socket, tuple[str, int]] = {}
    poller = zmq.Poller()
    try:
        for (host, port), msg in targets.items():
            sock = context().socket(zmq.REQ)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(f"tcp://{host}:{port}")
            try:
                sock.send(ENCODER.encode(msg), zmq.NOBLOCK)
            except zmq.Again:
                pass  # not connected yet: ZMQ queues it; a peer that never comes just times out
            socks[sock] = (host, port)
            poller.register(sock, zmq.POLLIN)
        answered: set[tuple[str, int]] = set()
        deadline = time.monotonic() + timeout_s
        while len(answered) < len(socks):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for sock, _ in poller.poll(int(left * 1000) + 1):
                sock.recv_multipart()
                answered.add(socks[sock])
                poller.unregister(sock)
        return answered
    finally:
        for sock in socks:
            sock.close()
