"""The shared-memory step broadcast: one writer, two readers (threads here, each attached through
a pickled handle exactly as a worker process attaches), the overflow path for a message larger
than a chunk, the stuck-reader error, and the reply queue."""

from __future__ import annotations

import pickle
import threading

import pytest

from host.core.distributed.message_queue import MessageQueue, ResponseQueue


def _reader(handle_bytes: bytes, reader: int, count: int, out: list) -> None:
    q = pickle.loads(handle_bytes).attach(reader)
    try:
        for _ in range(count):
            out.append(q.read(timeout=20))
        out.append(dict(q.stats))
    finally:
        q.close()


def _start_readers(mq: MessageQueue, count: int) -> tuple[list[threading.Thread], list[list]]:
    handle = pickle.dumps(mq.handle())
    outs: list[list] = [[], []]
    threads = [threading.Thread(target=_reader, args=(handle, r, count, outs[r])) for r in range(2)]
    for t in threads:
        t.start()
    mq.wait_until_ready(timeout=10)
    return threads, outs


def test_every_reader_gets_every_message_in_order_through_the_ring_and_the_overflow():
    mq = MessageQueue(2, max_chunk_bytes=4096, num_chunks=2, reader_names=["worker rank 0", "worker rank 1"])
    try:
        big = bytes(range(256)) * 64  # 16 KiB: larger than a chunk
        messages = [("step", i, {"tokens": list(range(i))}) for i in range(40)]
        messages[7] = ("big", 7, big)
        messages[30] = ("big", 30, big + b"x")
        threads, outs = _start_readers(mq, len(messages))
        seqs = [mq.enqueue(m, label=m[0]) for m in messages]  # 40 messages through 2 chunks: reuse waits
        for t in threads:
            t.join(30)
        assert seqs == list(range(1, 41))
        for out in outs:
            stats = out.pop()
            assert out == list(zip(seqs, messages))
            assert stats == {"shm": 38, "overflow": 2}
        assert mq.stats == {"shm": 38, "overflow": 2}
    finally:
        mq.close()


def test_a_reader_that_does_not_read_is_named_in_the_writers_timeout():
    mq = MessageQueue(2, max_chunk_bytes=1024, num_chunks=2, reader_names=["worker rank 0", "worker rank 1"])
    r0 = mq.handle().attach(0)
    r1 = mq.handle().attach(1)
    try:
        mq.wait_until_ready(timeout=10)
        mq.enqueue("a", label="execute_model")
        mq.enqueue("b", label="execute_model")
        assert r0.read(timeout=5) == (1, "a")
        assert r0.read(timeout=5) == (2, "b")
        # rank 1 has read nothing: message 3 needs chunk 0, which still holds message 1
        with pytest.raises(TimeoutError, match=r"worker rank 1 has not read message 1 \(execute_model\) for 0 s"):
            mq.enqueue("c", timeout=0.3)
        assert r1.read(timeout=5) == (1, "a")
        assert mq.enqueue("c", timeout=5) == 3
        # chunk 1 still holds message 2, which rank 1 has not read: an abort ends the wait
        mq.abort("worker rank 1 (pid 1) died with exit code -9")
        with pytest.raises(RuntimeError, match=r"worker rank 1 \(pid 1\) died"):
            mq.enqueue("d", timeout=30)
    finally:
        r0.close()
        r1.close()
        mq.close()


def test_a_reader_times_out_when_nothing_comes():
    mq = MessageQueue(1)
    reader = mq.handle().attach(0)
    try:
        with pytest.raises(TimeoutError, match="no message 1"):
            reader.read(timeout=0.2)
    finally:
        reader.close()
        mq.close()


def test_replies_come_back_with_their_sequence_and_rank():
    rq = ResponseQueue()
    senders = [pickle.loads(pickle.dumps(rq.handle())).attach() for _ in range(2)]
    try:
        senders[1].send(5, 1, True, {"x": 1})
        senders[0].send(5, 0, False, "ValueError: bad")
        senders[0].send(6, 0, True, lambda: None)  # does not pickle: fails that call only
        got = sorted((rq.recv(5) for _ in range(3)), key=lambda r: (r[0], r[1]))
        assert got[:2] == [(5, 0, False, "ValueError: bad"), (5, 1, True, {"x": 1})]
        seq, rank, ok, value = got[2]
        assert (seq, rank, ok) == (6, 0, False) and "does not pickle" in value
        assert rq.recv(0.05) is None
    finally:
        for s in senders:
            s.close()
        rq.close()
