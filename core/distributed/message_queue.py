"""The engine's step broadcast to its workers, and the workers' replies.

:class:`MessageQueue` is a shared-memory ring with one writer (the engine process) and N
readers (the workers). A message is serialized once and written once into a chunk of the ring;
every reader reads it from there (nothing is pickled through a pipe per worker). The ring has
``num_chunks`` chunks of ``max_chunk_bytes``; a message larger than a chunk goes through the
overflow path instead (its bytes published on the queue's ZMQ socket, the chunk only saying so),
so a large message is slower, never an error.

Per chunk the shared block holds the sequence number of the message in it, its size, an overflow
flag and, per reader, the sequence number that reader last read from it. Message ``n`` (from 1)
goes into chunk ``(n - 1) % num_chunks``; the writer reuses a chunk only when every reader has
read what it held, and waits at most ``timeout`` seconds for that: then a ``TimeoutError`` names
the reader and the message it has not read ("worker rank 1 has not read message 12
(execute_model) for 60 s"), so a stuck worker is named instead of a generic hang. A reader waits
for the next sequence number in its chunk. Waiting readers sleep on the ZMQ socket, which the
writer pokes after every message (one tiny frame), so an idle worker costs no CPU.

Messages are pickled (protocol 5): a step's ``SchedulerOutput`` is a dataclass of lists and
msgspec structs, which msgpack would flatten to dicts; pickling it is also faster here (see
docs/distributed.md, "Worker processes (mp)").

:class:`ResponseQueue` is the way back: one ZMQ PULL socket in the engine process, a PUSH
socket per worker. Replies are small (only the output rank returns a step's sampled tokens).

Both queues are built by the engine side; their :meth:`handle` objects pickle (into a spawned
process or a Ray actor) and ``attach()`` there. The writer owns the shared block: :meth:`MessageQueue.close`
unlinks it from ``/dev/shm`` (a reader only unmaps), and so does dropping the queue without closing
it (a ``weakref.finalize``), so no engine leaves a block behind until the interpreter exits.
"""

from __future__ import annotations

import pickle
import threading
import time
import weakref
from dataclasses import dataclass
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np
import zmq

DEFAULT_MAX_CHUNK_BYTES = 1 << 20
DEFAULT_NUM_CHUNKS = 8
DEFAULT_WRITE_TIMEOUT_S = 60.0

_WAKE = b"w"
_OVERFLOW = b"o"
# per chunk: seq, nbytes, overflow flag, then one "last read seq" per reader (all int64)
_FIXED_FIELDS = 3

_fence_lock = threading.Lock()


def _fence() -> None:
    """A full memory barrier between the data and the sequence number that publishes it (a lock
    round trip is one on every platform CPython runs on)."""
    with _fence_lock:
        pass


def _dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _attach_shm(name: str) -> SharedMemory:
    """Open an existing block without registering it with this process's resource tracker (which
    would unlink it when a reader exits; the writer owns it)."""
    register = resource_tracker.register
    resource_tracker.register = lambda *a, **k: None
    try:
        return SharedMemory(name=name)
    finally:
        resource_tracker.register = register


class _Ring:
    """The views over one shared block: a header table and the chunks' bytes."""

    def __init__(self, shm: SharedMemory, n_readers: int, num_chunks: int, max_chunk_bytes: int) -> None:
        self.shm = shm
        self.num_chunks = num_chunks
        self.max_chunk_bytes = max_chunk_bytes
        width = _FIXED_FIELDS + n_readers
        header_bytes = num_chunks * width * 8
        self.header = np.ndarray((num_chunks, width), dtype=np.int64, buffer=shm.buf[:header_bytes])
        self.data_offset = header_bytes

    @staticmethod
    def size(n_readers: int, num_chunks: int, max_chunk_bytes: int) -> int:
        return num_chunks * (_FIXED_FIELDS + n_readers) * 8 + num_chunks * max_chunk_bytes

    def chunk(self, index: int) -> memoryview:
        start = self.data_offset + index * self.max_chunk_bytes
        return self.shm.buf[start:start + self.max_chunk_bytes]

    def release(self) -> None:
        self.header = None  # type: ignore[assignment]  # drop the views before closing the block
        self.shm.close()


@dataclass(frozen=True)
class BroadcastHandle:
    """What a reader needs to attach to a :class:`MessageQueue` (pickles)."""

    shm_name: str
    n_readers: int
    num_chunks: int
    max_chunk_bytes: int
    address: str  # the writer's ZMQ XPUB socket (wake-ups and overflow messages)

    def attach(self, reader: int) -> "BroadcastReader":
        return BroadcastReader(self, reader)


class MessageQueue:
    """The writer side: created in the engine process, one per executor."""

    def __init__(
        self,
        n_readers: int,
        max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES,
        num_chunks: int = DEFAULT_NUM_CHUNKS,
        reader_names: list[str] | None = None,
        timeout: float = DEFAULT_WRITE_TIMEOUT_S,
        host: str = "127.0.0.1",
    ) -> None:
        if n_readers < 1 or num_chunks < 1 or max_chunk_bytes < 1:
            raise ValueError(
                f"MessageQueue(n_readers={n_readers}, num_chunks={num_chunks}, max_chunk_bytes={max_chunk_bytes}): "
                "all must be >= 1"
            )
        self.n_readers = n_readers
        self.reader_names = reader_names or [f"reader {i}" for i in range(n_readers)]
        self.timeout = timeout
        size = _Ring.size(n_readers, num_chunks, max_chunk_bytes)
        self._shm = SharedMemory(create=True, size=size)
        self._ring = _Ring(self._shm, n_readers, num_chunks, max_chunk_bytes)
        self._ring.header[:] = 0
        self._labels = [""] * num_chunks
        self._ctx = zmq.Context()
        self._socket = self._ctx.socket(zmq.XPUB)
        self._socket.setsockopt(zmq.XPUB_VERBOSE, 1)  # see every reader's subscription
        self._socket.setsockopt(zmq.SNDHWM, 0)  # readers lag at most num_chunks messages
        self._socket.setsockopt(zmq.LINGER, 0)
        port = self._socket.bind_to_random_port(f"tcp://{host}")
        self._address = f"tcp://{host}:{port}"
        self._subscribed = 0
        self._seq = 0
        self._aborted: str | None = None
        self.stats = {"shm": 0, "overflow": 0}
        self._close = weakref.finalize(self, _close_writer, self._socket, self._ctx, self._ring, self._shm)

    def handle(self) -> BroadcastHandle:
        ring = self._ring
        return BroadcastHandle(self._shm.name, self.n_readers, ring.num_chunks, ring.max_chunk_bytes, self._address)

    def wait_until_ready(self, timeout: float = 30.0) -> None:
        """Block until every reader has attached (its subscription reached the socket), so no
        wake-up or overflow message is published before a reader can get it."""
        deadline = time.monotonic() + timeout
        while self._subscribed < self.n_readers:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"only {self._subscribed} of {self.n_readers} readers attached to the broadcast queue "
                    f"within {timeout:.0f} s"
                )
            if self._socket.poll(int(min(left, 0.1) * 1000)):
                if self._socket.recv()[:1] == b"\x01":
                    self._subscribed += 1

    def abort(self, reason: str) -> None:
        """Make a waiting (and every later) :meth:`enqueue` raise ``RuntimeError(reason)``; safe
        from another thread (the executor's death monitor)."""
        self._aborted = reason

    def enqueue(self, obj: Any, label: str = "", timeout: float | None = None) -> int:
        """Broadcast ``obj`` to every reader; returns its sequence number. ``label`` (e.g. the
        method name) appears in the error if a reader does not take it."""
        if self._subscribed < self.n_readers:
            self.wait_until_ready()
        payload = _dumps(obj)
        ring = self._ring
        seq = self._seq + 1
        index = (seq - 1) % ring.num_chunks
        self._wait_chunk_free(index, seq, self.timeout if timeout is None else timeout)
        row = ring.header[index]
        overflow = len(payload) > ring.max_chunk_bytes
        if overflow:
            self._socket.send_multipart([_OVERFLOW, seq.to_bytes(8, "little"), payload], copy=False)
            row[1] = 0
            self.stats["overflow"] += 1
        else:
            ring.chunk(index)[: len(payload)] = payload
            row[1] = len(payload)
            self.stats["shm"] += 1
        row[2] = int(overflow)
        _fence()
        row[0] = seq  # publishes the chunk
        self._labels[index] = label
        self._seq = seq
        self._socket.send(_WAKE)
        return seq

    def _wait_chunk_free(self, index: int, seq: int, timeout: float) -> None:
        row = self._ring.header[index]
        held = int(row[0])
        if held == 0:
            return
        start = time.monotonic()
        sleep = 0.0
        while True:
            if self._aborted is not None:
                raise RuntimeError(self._aborted)
            readers = row[_FIXED_FIELDS:]
            behind = np.nonzero(readers != held)[0]
            if behind.size == 0:
                return
            waited = time.monotonic() - start
            if waited > timeout:
                r = int(behind[0])
                label = f" ({self._labels[index]})" if self._labels[index] else ""
                raise TimeoutError(
                    f"{self.reader_names[r]} has not read message {held}{label} for {timeout:.0f} s "
                    f"(message {seq} needs its slot); it is stuck or dead"
                )
            time.sleep(sleep)
            sleep = min(0.001, sleep + 0.00005)

    def close(self) -> None:
        """Close the socket and unmap and unlink the shared block; idempotent."""
        self._close()


def _close_writer(socket: Any, ctx: Any, ring: _Ring, shm: SharedMemory) -> None:
    """A :class:`MessageQueue`'s teardown (it references no queue: it is also its finalizer)."""
    socket.close(linger=0)
    ctx.term()
    ring.release()
    try:
        shm.unlink()
    except FileNotFoundError:
        pass


class BroadcastReader:
    """One reader's side of a :class:`MessageQueue` (made by :meth:`BroadcastHandle.attach`)."""

    def __init__(self, handle: BroadcastHandle, reader: int) -> None:
        if not 0 <= reader < handle.n_readers:
            raise ValueError(f"reader index {reader} is outside 0..{handle.n_readers - 1}")
        self.reader = reader
        self._ring = _Ring(_attach_shm(handle.shm_name), handle.n_readers, handle.num_chunks, handle.max_chunk_bytes)
        self._ctx = zmq.Context()
        self._socket = self._ctx.socket(zmq.SUB)
        self._socket.setsockopt(zmq.RCVHWM, 0)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._socket.connect(handle.address)
        self._overflow: dict[int, bytes] = {}
        self._next = 1
        self.stats = {"shm": 0, "overflow": 0}

    def _drain(self, timeout_ms: int) -> None:
        """Wait up to ``timeout_ms`` for the writer's socket, then take every frame waiting."""
        if not self._socket.poll(timeout_ms):
            return
        while True:
            try:
                frames = self._socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if frames[0] == _OVERFLOW:
                self._overflow[int.from_bytes(frames[1], "little")] = frames[2]

    def read(self, timeout: float | None = None) -> tuple[int, Any]:
        """The next message as ``(seq, obj)``; waits for it (``timeout`` seconds at most, then
        ``TimeoutError``; ``None``: forever)."""
        ring = self._ring
        seq = self._next
        index = (seq - 1) % ring.num_chunks
        row = ring.header[index]
        deadline = None if timeout is None else time.monotonic() + timeout
        while int(row[0]) != seq:
            wait = 0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic()))
            if deadline is not None and wait == 0.0:
                raise TimeoutError(f"reader {self.reader}: no message {seq} within {timeout} s")
            self._drain(int(wait * 1000))
        _fence()
        if row[2]:
            while seq not in self._overflow:
                self._drain(100)
            payload = self._overflow.pop(seq)
            self.stats["overflow"] += 1
        else:
            payload = bytes(ring.chunk(index)[: int(row[1])])
            self.stats["shm"] += 1
        _fence()
        row[_FIXED_FIELDS + self.reader] = seq  # the writer may reuse the chunk
        self._next = seq + 1
        return seq, pickle.loads(payload)

    def close(self) -> None:
        if self._ring is None:
            return
        self._socket.close(linger=0)
        self._ctx.term()
        self._ring.release()
        self._ring = None  # type: ignore[assignment]


@dataclass(frozen=True)
class ResponseHandle:
    """What a worker needs to reply to the engine (pickles)."""

    address: str

    def attach(self) -> "ResponseSender":
        return ResponseSender(self.address)


class ResponseQueue:
    """The engine side of the replies: one socket every worker pushes to."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._ctx = zmq.Context()
        self._socket = self._ctx.socket(zmq.PULL)
        self._socket.setsockopt(zmq.LINGER, 0)
        port = self._socket.bind_to_random_port(f"tcp://{host}")
        self._address = f"tcp://{host}:{port}"
        self._closed = False

    def handle(self) -> ResponseHandle:
        return ResponseHandle(self._address)

    def recv(self, timeout: float) -> tuple[int, int, bool, Any] | None:
        """The next reply ``(seq, rank, ok, value)``, or ``None`` after ``timeout`` seconds."""
        if not self._socket.poll(int(timeout * 1000)):
            return None
        return pickle.loads(self._socket.recv())

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._socket.close(linger=0)
            self._ctx.term()


class ResponseSender:
    """A worker's side of the replies."""

    def __init__(self, address: str) -> None:
        self._ctx = zmq.Context()
        self._socket = self._ctx.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.LINGER, 2000)  # a reply sent just before exit still arrives
        self._socket.connect(address)

    def send(self, seq: int, rank: int, ok: bool, value: Any) -> None:
        try:
            data = _dumps((seq, rank, ok, value))
        except Exception as exc:  # noqa: BLE001 - an unpicklable result fails the call, not the worker
            data = _dumps((seq, rank, False, f"the result of message {seq} does not pickle: {type(exc).__name__}: {exc}"))
        self._socket.send(data, copy=False)

    def close(self) -> None:
        if self._ctx is not None:
            self._socket.close()
            self._ctx.term()
            self._ctx = None  # type: ignore[assignment]
