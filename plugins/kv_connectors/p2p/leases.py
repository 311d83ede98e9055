"""The producer's lease table: a handed-off request's blocks stay pinned until its consumer says
DONE or its lease expires.

A lease starts at ``kv_lease_duration`` (30 s by default) when the worker learns of the
hand-off; each heartbeat moves the expiry to ``now + 2/3 * lease`` unless it is already later
(``max``: a heartbeat never shortens a lease); ids without a lease are ignored. A lease rather
than a reference count: a consumer that crashed never says DONE, and its blocks would stay
pinned forever. The reaper scans every entry (heartbeats reorder expiries in place, so the
table is not sorted by expiry) and logs each expiry: a consumer whose heartbeats are late
under load needs a longer ``kv_lease_duration``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Callable

logger = logging.getLogger("host.kv_connectors.p2p")

RELEASED_MEMORY = 4096  # ended leases remembered, so a late READ is told "released", not "unknown"


class LeaseTable:
    """Thread-safe: the side-channel thread reads and extends leases, the worker's step starts
    and reaps them."""

    def __init__(self, lease_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if lease_s <= 0:
            raise ValueError(f"kv_lease_duration={lease_s!r} must be a positive number of seconds")
        self.lease_s = float(lease_s)
        self.extension_s = self.lease_s * 2 / 3
        self._clock = clock
        self._lock = threading.Lock()
        self._expiry: dict[str, float] = {}
        self._blocks: dict[str, list[int]] = {}
        self._finished: set[str] = set()
        self._released: OrderedDict[str, str] = OrderedDict()

    def start(self, req_id: str, block_ids: list[int]) -> None:
        with self._lock:
            self._expiry[req_id] = self._clock() + self.lease_s
            self._blocks[req_id] = list(block_ids)

    def heartbeat(self, req_ids: list[str]) -> int:
        """Extend the leases of the ids held here; returns how many were."""
        new_expiry = self._clock() + self.extension_s
        n = 0
        with self._lock:
            for req_id in req_ids:
                if req_id in self._expiry:
                    self._expiry[req_id] = max(self._expiry[req_id], new_expiry)
                    n += 1
        return n

    def blocks(self, req_id: str) -> list[int] | None:
        with self._lock:
            return self._blocks.get(req_id)

    def released_reason(self, req_id: str) -> str | None:
        with self._lock:
            return self._released.get(req_id)

    def done(self, req_id: str) -> bool:
        """The consumer read the blocks: release them now. False for an id without a lease."""
        with self._lock:
            return self._end(req_id, "read by its consumer")

    def reap(self) -> list[str]:
        """End every expired lease (a full scan); returns their ids."""
        now = self._clock()
        with self._lock:
            expired = [r for r, t in self._expiry.items() if t <= now]
            for req_id in expired:
                self._end(req_id, "lease expired")
        for req_id in expired:
            logger.warning(
                "Releasing expired KV blocks for request %s: no DONE or heartbeat from its consumer within "
                "the lease (kv_lease_duration=%.1fs); a consumer busy under load may need a larger "
                "kv_lease_duration in kv_connector_extra_config", req_id, self.lease_s)
        return expired

    def take_finished(self) -> set[str]:
        """Ids whose blocks may be freed, since the last call."""
        with self._lock:
            out, self._finished = self._finished, set()
        return out

    def __len__(self) -> int:
        with self._lock:
            return len(self._expiry)

    def _end(self, req_id: str, reason: str) -> bool:
        if self._expiry.pop(req_id, None) is None:
            return False
        self._blocks.pop(req_id, None)
        self._finished.add(req_id)
        self._released[req_id] = reason
        while len(self._released) > RELEASED_MEMORY:
            self._released.popitem(last=False)
        return True
