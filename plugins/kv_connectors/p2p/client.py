"""One request/reply round trip to a producer's side channel, bounded by a receive timeout
(a dead or hung producer is a ``TimeoutError`` after ``timeout_s``, never a hang)."""

from __future__ import annotations

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
