"""The p2p connector's two worker roles (and scheduler roles) talking over real ZMQ sockets on
127.0.0.1, with real KV tensors and engine Request objects, no engine: a pull copies the
producer's exact bytes; leases live while heartbeats come and expire (with a warning) when they
stop; every way a producer can go wrong (incompatible, dead, restarted) ends the consumer's
transfer as a bounded failure with its blocks reported, never a hang; a failed release keeps
the blocks; remote-engine TTL eviction skips engines with reads in flight."""

from __future__ import annotations

import logging
import socket
import time
from types import SimpleNamespace

import pytest
import torch

from host.contracts.request import Request, RequestStatus
from host.core.config import CacheConfig, EngineConfig, KVTransferConfig, ModelConfig
from host.plugins.kv_connectors.p2p import P2PConnector
from host.plugins.kv_connectors.p2p import transfer as transfer_mod
from host.plugins.kv_connectors.p2p.client import call
from host.plugins.kv_connectors.p2p.protocol import Heartbeat
from host.plugins.kv_connectors.p2p.remotes import RemoteEngines
from host.sdk.kv_connector import KVConnectorRole

BS = 4
SHAPE = (2, 16, BS, 2, 8)  # (K/V, blocks, block size, kv heads, head size)
WORKER, SCHEDULER = KVConnectorRole.WORKER, KVConnectorRole.SCHEDULER


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(role: str, port: int, model: str = "tiny", **extra) -> EngineConfig:
    extra.setdefault("side_channel_port", port)
    return EngineConfig(model=ModelConfig(model=model), cache=CacheConfig(block_size=BS),
                        kv_transfer=KVTransferConfig(kv_connector="p2p", kv_role=role, kv_connector_extra_config=extra))


class Side:
    """Both roles of one instance over its own KV tensors."""

    def __init__(self, cfg: EngineConfig, fill: bool) -> None:
        self.cfg = cfg
        self.sched = P2PConnector(cfg, SCHEDULER)
        self.worker = P2PConnector(cfg, WORKER)
        gen = torch.Generator().manual_seed(0)
        self.kv = {f"layers.{i}": (torch.randn(SHAPE, generator=gen) if fill else torch.zeros(SHAPE)) for i in range(2)}
        self.worker.register_kv_caches(self.kv)

    def step(self):
        """One engine step's worker calls: the plan, the loads, the report."""
        meta = self.sched.build_connector_meta(SimpleNamespace(finished_req_ids=set()))
        self.worker.bind_connector_metadata(meta)
        self.worker.start_load_kv(None)
        results = self.worker.get_transfer_results()
        errors = self.worker.get_block_ids_with_load_errors()
        self.worker.clear_connector_metadata()
        return results, errors

    def close(self):
        self.worker.shutdown()


PROMPT = list(range(3, 13))  # 10 tokens: 3 blocks, the last one partial


def hand_off(producer: Side, req_id: str = "p1", block_ids=(3, 4, 9)) -> dict:
    req = Request(req_id, PROMPT, kv_transfer_params={"do_remote_decode": True})
    req.num_computed_tokens = len(PROMPT)
    req.status = RequestStatus.FINISHED_LENGTH_CAPPED
    delay, params = producer.sched.request_finished(req, list(block_ids))
    assert delay and params["remote_num_tokens"] == len(PROMPT)
    assert params["remote_block_ids"] == list(block_ids)
    producer.step()  # the producer's workers lease the blocks
    return params


def admit(consumer: Side, params: dict, req_id: str = "d1", block_ids=(0, 1, 2)) -> None:
    req = Request(req_id, PROMPT, kv_transfer_params=params)
    n, load_async = consumer.sched.get_num_new_matched_tokens(req, 0)
    assert (n, load_async) == (len(PROMPT), True)
    consumer.sched.update_state_after_alloc(req, list(block_ids), n)


def until(fn, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.01)
    raise AssertionError(f"not within {timeout}s")


@pytest.fixture
def pair():
    made: list[Side] = []

    def make(prod_extra=None, cons_extra=None, cons_model="tiny"):
        port = free_port()
        producer = Side(config("kv_producer", port, **(prod_extra or {})), fill=True)
        consumer = Side(config("kv_consumer", port, model=cons_model, **(cons_extra or {})), fill=False)
        made.extend([producer, consumer])
        return producer, consumer

    yield make
    for side in made:
        side.close()


def recv(consumer: Side, timeout=5.0):
    """Step the consumer until its transfer is reported: (results, load errors)."""
    seen = {"errors": set()}

    def poll():
        results, errors = consumer.step()
        seen["errors"] |= errors
        return results if results.finished_recving else None

    results = until(poll, timeout)
    return results, seen["errors"]


def test_a_pull_copies_the_producers_blocks_and_done_releases_them(pair):
    producer, consumer = pair()
    params = hand_off(producer)
    admit(consumer, params)
    results, errors = recv(consumer)
    assert results.finished_recving == {"d1"} and not results.failed_recving and not errors
    for name in producer.kv:
        assert torch.equal(consumer.kv[name][:, [0, 1, 2]], producer.kv[name][:, [3, 4, 9]])
        assert not consumer.kv[name][:, 3:].any()  # nothing else written
    # DONE ends the lease: the producer frees the blocks
    assert until(lambda: producer.step()[0].finished_sending) == {"p1"}
    nbytes = 2 * 2 * 3 * BS * 2 * 8 * 4  # layers, K/V, blocks, block size, heads, head size, fp32
    assert consumer.worker.get_worker_stats() == {"load_bytes": nbytes}
    assert producer.worker.get_worker_stats() == {"save_bytes": nbytes}
    assert consumer.sched.get_stats() == {"external_hit_tokens": len(PROMPT)}


def test_heartbeats_keep_a_lease_past_its_duration_and_without_them_it_expires(pair, caplog):
    producer, consumer = pair(prod_extra={"kv_lease_duration": 0.6})
    params = hand_off(producer)
    start = time.monotonic()
    while time.monotonic() - start < 1.3:  # twice the lease, heartbeats every 0.2 s
        call("127.0.0.1", params["remote_port"], Heartbeat(["p1", "not-a-lease"]), 1.0)
        assert not producer.step()[0].finished_sending
        time.sleep(0.2)
    with caplog.at_level(logging.WARNING, logger="host.kv_connectors.p2p"):
        released = until(lambda: producer.step()[0].finished_sending, timeout=2.0)
    assert released == {"p1"}
    assert time.monotonic() - start >= 1.3 + 0.3  # not before the last heartbeat's 2/3 lease
    assert "Releasing expired KV blocks for request p1" in caplog.text and "kv_lease_duration" in caplog.text
    # a consumer arriving after the release fails cleanly, its blocks reported
    admit(consumer, params)
    results, errors = recv(consumer)
    assert results.failed_recving == {"d1"} and errors == {0, 1, 2}


def test_a_compatibility_mismatch_is_a_clear_failure(pair, caplog):
    producer, consumer = pair(cons_model="another-model")
    params = hand_off(producer)
    admit(consumer, params)
    with caplog.at_level(logging.WARNING, logger="host.kv_connectors.p2p"):
        results, errors = recv(consumer)
    assert results.failed_recving == {"d1"} and errors == {0, 1, 2}
    assert "compatibility hash mismatch" in caplog.text
    assert "model: producer 'tiny' vs consumer 'another-model'" in caplog.text
    assert "enforce_compat_hash" in caplog.text
    assert not consumer.kv["layers.0"].any()


def test_a_dead_port_fails_within_the_handshake_timeout(pair):
    _, consumer = pair(cons_extra={"handshake_timeout_s": 0.5})
    params = {"do_remote_prefill": True, "remote_engine_id": "gone", "remote_host": "127.0.0.1",
              "remote_port": free_port(), "remote_block_ids": [3, 4, 9], "remote_num_tokens": len(PROMPT),
              "remote_request_id": "p1", "tp_size": 1}
    admit(consumer, params)
    start = time.monotonic()
    results, errors = recv(consumer, timeout=3.0)
    assert time.monotonic() - start < 2.0
    assert results.failed_recving == {"d1"} and errors == {0, 1, 2}
    assert consumer.worker.get_worker_stats() == {"failed_transfers": 1}


def test_a_restarted_producer_fails_the_transfer_without_hanging(pair):
    producer, consumer = pair(cons_extra={"unknown_request_grace_s": 0.3})
    params = hand_off(producer)
    port = params["remote_port"]
    producer.close()
    restarted = Side(config("kv_producer", port), fill=True)  # same port, a new engine id
    try:
        admit(consumer, params)
        results, errors = recv(consumer)
        assert results.failed_recving == {"d1"} and errors == {0, 1, 2}
        # the same engine, but a request it never leased: failed after the grace period
        bogus = dict(params, remote_engine_id=restarted.cfg.kv_transfer.engine_id, remote_request_id="never")
        admit(consumer, bogus, req_id="d2", block_ids=(5, 6, 7))
        start = time.monotonic()
        results, errors = recv(consumer)
        assert results.failed_recving == {"d2"} and errors == {5, 6, 7}
        assert 0.3 <= time.monotonic() - start < 2.0
        # and a real hand-off from the restarted producer still works
        params2 = hand_off(restarted, "p2")
        admit(consumer, params2, req_id="d3")
        results, errors = recv(consumer)
        assert results.finished_recving == {"d3"} and not results.failed_recving and not errors
        assert torch.equal(consumer.kv["layers.1"][:, [0, 1, 2]], restarted.kv["layers.1"][:, [3, 4, 9]])
    finally:
        restarted.close()


def test_a_failed_release_keeps_the_blocks_until_it_succeeds(pair, monkeypatch):
    _, consumer = pair(cons_extra={"handshake_timeout_s": 0.3})
    params = {"do_remote_prefill": True, "remote_engine_id": "gone", "remote_host": "127.0.0.1",
              "remote_port": free_port(), "remote_block_ids": [1, 2, 3], "remote_num_tokens": len(PROMPT),
              "tp_size": 1}
    fail = {"n": 3}
    real_release = transfer_mod.TransferHandle.release

    def release(self):
        if fail["n"] > 0:
            fail["n"] -= 1
            raise RuntimeError("backend cannot confirm the transfer stopped")
        real_release(self)

    monkeypatch.setattr(transfer_mod.TransferHandle, "release", release)
    admit(consumer, params)
    consumer.worker.bind_connector_metadata(consumer.sched.build_connector_meta(SimpleNamespace(finished_req_ids=set())))
    consumer.worker.start_load_kv(None)
    handle = consumer.worker._handles["d1"]
    until(lambda: handle.future.done())
    for _ in range(3):  # failed, but not released: not reported, blocks not handed back
        results, errors = consumer.step()
        assert not results.finished_recving and not errors
        assert "d1" in consumer.worker._handles
    results, errors = consumer.step()
    assert results.finished_recving == {"d1"} and results.failed_recving == {"d1"} and errors == {0, 1, 2}


def test_a_short_prompt_and_a_full_local_hit(pair):
    producer, consumer = pair()
    # a prompt shorter than one block
    req = Request("p1", [5, 6, 7], kv_transfer_params={"do_remote_decode": True})
    req.num_computed_tokens = 3
    req.status = RequestStatus.FINISHED_LENGTH_CAPPED
    _, params = producer.sched.request_finished(req, [6])
    producer.step()
    creq = Request("d1", [5, 6, 7], kv_transfer_params=params)
    assert consumer.sched.get_num_new_matched_tokens(creq, 0) == (3, True)
    consumer.sched.update_state_after_alloc(creq, [2], 3)
    results, _ = recv(consumer)
    assert results.finished_recving == {"d1"} and not results.failed_recving
    assert torch.equal(consumer.kv["layers.0"][:, 2], producer.kv["layers.0"][:, 6])
    until(lambda: producer.step()[0].finished_sending)
    # everything already cached locally: nothing to load, and the producer is told DONE at once
    params = hand_off(producer, "p2")
    full = Request("d2", PROMPT, kv_transfer_params=params)
    assert consumer.sched.get_num_new_matched_tokens(full, len(PROMPT)) == (0, False)
    consumer.step()
    assert until(lambda: producer.step()[0].finished_sending) == {"p2"}
    # preempted / aborted before hand-off: nothing handed off
    gone = Request("p3", PROMPT, kv_transfer_params={"do_remote_decode": True})
    gone.status = RequestStatus.FINISHED_ABORTED
    assert producer.sched.request_finished(gone, []) == (False, None)


def test_ttl_eviction_skips_engines_with_reads_in_flight():
    now = [0.0]
    evicted = []
    remotes = RemoteEngines(10.0, clock=lambda: now[0], on_evict=lambda e, info: evicted.append(e))
    remotes.add("a", "A", busy=set())
    remotes.add("b", "B", busy=set())
    now[0] = 11.0
    remotes.touch("b")  # a read issued to b
    assert remotes.add("c", "C", busy=set()) == ["a"]
    now[0] = 30.0  # b and c idle past the TTL, but b has a read in flight
    assert remotes.add("d", "D", busy={"b"}) == ["c"]
    assert sorted(remotes.info) == ["b", "d"] and evicted == ["a", "c"]
    assert RemoteEngines(0).add("x", "X", busy=set()) == []  # ttl 0: never evicts


def test_the_consumers_heartbeats_keep_a_delayed_pull_alive(pair, caplog):
    # the one handshake thread is stuck on a dead producer for 1.5 s; meanwhile the live
    # producer's 0.6 s lease survives on the consumer's heartbeats, and the pull then succeeds
    producer, consumer = pair(prod_extra={"kv_lease_duration": 0.6},
                              cons_extra={"handshake_timeout_s": 1.5, "heartbeat_interval_s": 0.1})
    params = hand_off(producer)
    dead = dict(params, remote_port=free_port(), remote_engine_id="gone", remote_request_id="x")
    admit(consumer, dead, req_id="d0", block_ids=(5, 6, 7))
    admit(consumer, params, req_id="d1")
    start = time.monotonic()
    reported: dict[str, set] = {"ok": set(), "failed": set()}

    def poll():
        producer.step()
        results, _ = consumer.step()
        reported["ok"] |= results.finished_recving - results.failed_recving
        reported["failed"] |= results.failed_recving
        return reported["ok"] | reported["failed"] == {"d0", "d1"}

    with caplog.at_level(logging.WARNING, logger="host.kv_connectors.p2p"):
        until(poll, timeout=6.0)
    assert time.monotonic() - start >= 1.4
    assert reported == {"ok": {"d1"}, "failed": {"d0"}}
    assert torch.equal(consumer.kv["layers.0"][:, [0, 1, 2]], producer.kv["layers.0"][:, [3, 4, 9]])
    assert "Releasing expired" not in caplog.text
    assert producer.worker.leases.released_reason("p1") == "read by its consumer"
