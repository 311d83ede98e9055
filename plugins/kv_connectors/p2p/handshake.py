"""The out-of-band handshake: what a producer worker tells its consumers about itself, the
compatibility hash both sides compute, and the consumer's idempotent, asynchronous handshake.

The hash covers what must agree for a producer's block bytes to mean the same thing in the
consumer's cache: host version, model, dtype, KV cache dtype, the per-block KV shape and
layout, attention backend, block size, tensor/pipeline sizes. A mismatch is a RuntimeError naming
every differing input (``enforce_compat_hash: false`` turns the check off; not recommended).

A handshake is a network round trip: it runs on a 1-thread executor (never in the step), and
``ensure`` is idempotent under an RLock: done -> None, in flight -> its future, else a new one.
"""

from __future__ import annotations

import hashlib
import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import torch

from .client import call
from .protocol import HANDSHAKE_DECODER, GetMeta, HandshakePayload


def compat_inputs(config: Any, kv_caches: dict[str, torch.Tensor]) -> dict[str, Any]:
    import host

    first = next(iter(kv_caches.values())) if kv_caches else None
    return {
        "host_version": host.__version__,
        "model": str(config.model.model),
        "dtype": str(config.model.dtype),
        "kv_cache_dtype": str(first.dtype) if first is not None else str(config.cache.cache_dtype),
        "kv_block_shape": list(first.shape[2:]) if first is not None else [],
        "kv_layout": "2,num_blocks,block_size,kv_heads,head_size",
        "attention_backend": str(config.attention_backend or "auto"),
        "block_size": int(config.cache.block_size),
        "tensor_parallel_size": int(config.parallel.tensor_parallel_size),
        "pipeline_parallel_size": int(config.parallel.pipeline_parallel_size),
    }


def compat_hash(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def check_compat(local: dict[str, Any], remote: HandshakePayload, where: str) -> None:
    """RuntimeError unless the remote's hash is ours, naming each input that differs."""
    mine = compat_hash(local)
    if remote.compatibility_hash == mine:
        return
    diffs = [f"{k}: producer {remote.compat_inputs.get(k)!r} vs consumer {local.get(k)!r}"
             for k in sorted(set(local) | set(remote.compat_inputs)) if local.get(k) != remote.compat_inputs.get(k)]
    raise RuntimeError(
        f"p2p KV connector compatibility hash mismatch with {where}: producer {remote.compatibility_hash} "
        f"vs consumer {mine} ({'; '.join(diffs) or 'inputs equal, hash function differs'}). Start both "
        "instances with the same model, dtype, KV cache dtype, block size, attention backend and parallel "
        "sizes; to skip the check (not recommended: the blocks may be misread) set "
        '"enforce_compat_hash": false in kv_connector_extra_config')


class Handshaker:
    """The consumer worker's handshakes, one per producer side channel (host, port)."""

    def __init__(self, local_inputs: dict[str, Any], rank: int, world_size: int, timeout_s: float,
                 enforce: bool = True, on_new: Callable[[HandshakePayload], None] = lambda p: None) -> None:
        self.local_inputs = local_inputs
        self.rank, self.world_size = rank, world_size
        self.timeout_s = timeout_s
        self.enforce = enforce
        self.on_new = on_new
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="p2p-handshake")
        self._lock = threading.RLock()
        self._futures: dict[tuple[str, int], Future] = {}
        self._done: dict[tuple[str, int], HandshakePayload] = {}

    def ensure(self, host: str, port: int) -> Future | None:
        key = (host, port)
        with self._lock:
            if key in self._done:
                return None
            fut = self._futures.get(key)
            if fut is None:
                fut = self._futures[key] = self._executor.submit(self._handshake, host, port)
                fut.add_done_callback(lambda f, key=key: self._finished(key, f))
            return fut

    def get(self, host: str, port: int) -> HandshakePayload:
        """The payload, handshaking first if needed (waits; raises the handshake's error)."""
        fut = self.ensure(host, port)
        if fut is not None:
            fut.result()
        with self._lock:
            return self._done[(host, port)]

    def forget(self, host: str, port: int) -> None:
        """Drop a handshake (the producer restarted: the next transfer handshakes again)."""
        with self._lock:
            self._done.pop((host, port), None)

    def _finished(self, key: tuple[str, int], fut: Future) -> None:
        with self._lock:
            self._futures.pop(key, None)
            if not fut.cancelled() and fut.exception() is None:
                self._done[key] = fut.result()

    def _handshake(self, host: str, port: int) -> HandshakePayload:
        frames = call(host, port, GetMeta(rank=self.rank), self.timeout_s)
        payload = HANDSHAKE_DECODER.decode(frames[0].buffer)
        if payload.world_size != self.world_size:
            raise RuntimeError(
                f"p2p KV connector: the producer at {host}:{port} runs {payload.world_size} worker ranks "
                f"(tensor x pipeline parallel) and this consumer {self.world_size}; the p2p connector needs the "
                "same -tp and -pp on both sides")
        if self.enforce:
            check_compat(self.local_inputs, payload, f"{host}:{port}")
        self.on_new(payload)
        return payload

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
