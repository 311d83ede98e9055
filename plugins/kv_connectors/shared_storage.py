"""``shared_storage`` KV connector: full KV blocks saved by chained block hash into a directory
that any instance (or the same one after a restart) reads back — a prefix cache that outlives
the engine and is shared between compatible instances.

``kv_connector_extra_config``:

- ``path``: the directory (default ``/dev/shm/host-kv`` when ``/dev/shm`` exists, else
  ``<tmp>/host-kv``); created if missing.
- ``max_bytes``: size cap of this instance's files (default none); after each step's saves the
  least recently used files (by mtime; a load touches its file) are deleted until under it.

Layout: ``<path>/<fingerprint>/<block hash hex>.r<rank>.pt``. The fingerprint hashes what makes
KV bytes interchangeable (model, dtype, KV cache dtype, block size, tensor and pipeline parallel
sizes), so instances share blocks only when compatible; each worker rank stores its own shard
(all of its layers' K/V for that block, one tensor ``(layers, 2, block_size, heads,
head_size)``), written to a temporary name and ``os.replace``-d, so a reader never sees a
partial file. A block counts as stored once every rank's file exists.

Scheduler role: the external hit is the longest run of stored full blocks after the local hit
(loaded synchronously in the same step); every full block a request computes is saved after the
step's forward unless already stored. Worker role: a missing, unreadable or wrongly shaped file
at load time puts that block and the request's later loaded blocks in
``get_block_ids_with_load_errors`` (the host recomputes from there or fails the request, per
``kv_load_failure_policy``). Stats: ``external_hit_tokens`` (scheduler), ``load_bytes``,
``save_bytes``, ``failed_transfers`` (workers).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

import torch

from host.sdk.kv_connector import KVConnector, KVConnectorMetadata, KVConnectorRole

logger = logging.getLogger(__name__)


def default_path() -> str:
    """``/dev/shm/host-kv`` where ``/dev/shm`` exists, else ``<tmp>/host-kv``."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return os.path.join(base, "host-kv")


def fingerprint(config: Any) -> str:
    """What makes two instances' KV blocks interchangeable, hashed (16 hex digits)."""
    parts = [
        str(config.model.model), str(config.model.dtype), str(config.cache.cache_dtype),
        str(config.cache.block_size), str(config.parallel.tensor_parallel_size),
        str(config.parallel.pipeline_parallel_size),
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


@dataclass
class SharedStoragePlan(KVConnectorMetadata):
    """One step's work: ``loads`` (request id, block ids, block hashes hex) and ``saves``
    (block id, block hash hex)."""

    loads: list[tuple[str, list[int], list[str]]] = field(default_factory=list)
    saves: list[tuple[int, str]] = field(default_factory=list)


class SharedStorageConnector(KVConnector):
    """KV blocks in a shared directory, keyed by chained block hash (module docstring)."""

    name = "shared_storage"

    def __init__(self, config: Any, role: KVConnectorRole) -> None:
        super().__init__(config, role)
        extra = config.kv_transfer.extra if config.kv_transfer is not None else {}
        self.block_size = config.cache.block_size
        self.world_size = config.parallel.world_size
        self.dir = os.path.join(str(extra.get("path") or default_path()), fingerprint(config))
        self.max_bytes = extra.get("max_bytes")
        if self.max_bytes is not None and (not isinstance(self.max_bytes, int) or self.max_bytes <= 0):
            raise ValueError(f"shared_storage: max_bytes={self.max_bytes!r} must be a positive integer "
                             "(bytes), or left out for no cap")
        os.makedirs(self.dir, exist_ok=True)
        # scheduler role
        self.requests: dict[str, Any] = {}
        self.first: dict[str, int] = {}
        self.blocks: dict[str, list[int]] = {}
        self.saved: dict[str, int] = {}  # request id -> full blocks already stored or planned
        self.pending: list[tuple[str, list[int], list[str]]] = []
        self.hits = 0
        # worker role
        self.rank = 0
        self.layers: list[torch.Tensor] = []
        self.bad: set[int] = set()
        self.stats = {"load_bytes": 0, "save_bytes": 0, "failed_transfers": 0}

    def file(self, hash_hex: str, rank: int) -> str:
        return os.path.join(self.dir, f"{hash_hex}.r{rank}.pt")

    def stored(self, hash_hex: str) -> bool:
        return all(os.path.exists(self.file(hash_hex, r)) for r in range(self.world_size))

    # -- scheduler role ----------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        rid = request.request_id
        self.requests[rid] = request
        first = self.first[rid] = num_computed_tokens // self.block_size
        n = 0
        for h in request.block_hashes[first:]:
            if not self.stored(h.hex()):
                break
            n += 1
        return n * self.block_size, False

    def update_state_after_alloc(self, request: Any, block_ids: list[int], num_external_tokens: int) -> None:
        if num_external_tokens <= 0:
            return
        rid = request.request_id
        first, n = self.first[rid], -(-num_external_tokens // self.block_size)
        hashes = [h.hex() for h in request.block_hashes[first:first + n]]
        self.pending.append((rid, list(block_ids[first:first + n]), hashes))
        self.hits += num_external_tokens

    def build_connector_meta(self, scheduler_output: Any) -> SharedStoragePlan:
        plan = SharedStoragePlan(loads=self.pending)
        self.pending = []
        computed: dict[str, int] = {}
        for new in scheduler_output.scheduled_new_reqs:
            self.blocks[new.req_id] = list(new.block_ids)
            computed[new.req_id] = new.num_computed_tokens
        cached = scheduler_output.scheduled_cached_reqs
        for rid, ids, nc in zip(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens):
            self.blocks.setdefault(rid, []).extend(ids)
            computed[rid] = nc
        for rid, nc in computed.items():
            request = self.requests.get(rid)
            if request is None:
                continue
            done = (nc + scheduler_output.num_scheduled_tokens.get(rid, 0)) // self.block_size
            hashes, blocks = request.block_hashes, self.blocks[rid]
            done = min(done, len(hashes), len(blocks))
            for i in range(self.saved.get(rid, 0), done):
                h = hashes[i].hex()
                if not self.stored(h):
                    plan.saves.append((blocks[i], h))
            self.saved[rid] = max(self.saved.get(rid, 0), done)
        return plan

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, None]:
        for d in (self.requests, self.first, self.blocks, self.saved):
            d.pop(request.request_id, None)
        return False, None

    def get_stats(self) -> dict[str, int]:
        hits, self.hits = self.hits, 0
        return {"external_hit_tokens": hits}

    # -- worker role -------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        self.rank = _rank()
        self.layers = list(kv_caches.values())

    def start_load_kv(self, forward_context: Any) -> None:
        plan = self._metadata
        if not isinstance(plan, SharedStoragePlan):
            return
        for rid, ids, hashes in plan.loads:
            for j, (b, h) in enumerate(zip(ids, hashes)):
                path = self.file(h, self.rank)
                try:
                    block = torch.load(path, map_location="cpu", weights_only=True)
                    want = (len(self.layers), *self.layers[0][:, b].shape)
                    if tuple(block.shape) != want:
                        raise ValueError(f"shape {tuple(block.shape)}, expected {want}")
                    for layer, kv in enumerate(self.layers):
                        kv[:, b].copy_(block[layer])
                    os.utime(path)
                    self.stats["load_bytes"] += block.numel() * block.element_size()
                except Exception as e:  # noqa: BLE001 - any bad file is a load error
                    logger.warning("shared_storage: request %s: cannot load block %s from %s (%s); "
                                   "it is recomputed", rid, h, path, e)
                    self.bad.update(ids[j:])
                    self.stats["failed_transfers"] += 1
                    break

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any) -> None:
        pass  # the whole block is written in wait_for_save, once every layer has its KV

    def wait_for_save(self) -> None:
        plan = self._metadata
        if not isinstance(plan, SharedStoragePlan) or not plan.saves:
            return
        for b, h in plan.saves:
            path = self.file(h, self.rank)
            if os.path.exists(path):
                continue
            block = torch.stack([kv[:, b] for kv in self.layers]).cpu()
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-", suffix=".pt")
            try:
                with os.fdopen(fd, "wb") as f:
                    torch.save(block, f)
                os.replace(tmp, path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
            self.stats["save_bytes"] += block.numel() * block.element_size()
        if self.max_bytes is not None:
            self.evict()

    def evict(self) -> None:
        """Delete the least recently used files until the directory is under ``max_bytes``."""
        entries = []
        for entry in os.scandir(self.dir):
            if entry.name.endswith(".pt") and not entry.name.startswith(".tmp-"):
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue
                entries.append((st.st_mtime_ns, st.st_size, entry.path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            total -= size

    def get_block_ids_with_load_errors(self) -> set[int]:
        bad, self.bad = self.bad, set()
        return bad

    def get_worker_stats(self) -> dict[str, int]:
        out, self.stats = self.stats, {"load_bytes": 0, "save_bytes": 0, "failed_transfers": 0}
        return out
