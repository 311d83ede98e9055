"""The consumer's table of remote (producer) engines it talked to, with TTL eviction.

``last_active`` is stamped when a read is issued, not while it runs, so an engine with a read
still in flight can look idle: eviction skips every engine in ``busy``. It runs when a new
engine appears (the only time the table grows), and ``remote_engine_ttl_s <= 0`` turns it off.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

logger = logging.getLogger("host.kv_connectors.p2p")


class RemoteEngines:
    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic,
                 on_evict: Callable[[str, Any], None] = lambda eid, info: None) -> None:
        self.ttl_s = float(ttl_s)
        self._clock = clock
        self._on_evict = on_evict
        self._lock = threading.Lock()
        self.info: dict[str, Any] = {}
        self.last_active: dict[str, float] = {}

    def touch(self, engine_id: str) -> None:
        with self._lock:
            if engine_id in self.info:
                self.last_active[engine_id] = self._clock()

    def add(self, engine_id: str, info: Any, busy: set[str]) -> list[str]:
        """Register an engine (a new one evicts stale idle ones first); returns evicted ids."""
        with self._lock:
            evicted = [] if engine_id in self.info else self._evict_stale(busy)
            self.info[engine_id] = info
            self.last_active[engine_id] = self._clock()
        return evicted

    def _evict_stale(self, busy: set[str]) -> list[str]:
        if self.ttl_s <= 0:
            return []
        now = self._clock()
        evicted = [e for e, t in self.last_active.items() if now - t > self.ttl_s and e not in busy]
        for e in evicted:
            info = self.info.pop(e)
            del self.last_active[e]
            logger.info("p2p KV connector: forgetting remote engine %s (idle over remote_engine_ttl_s=%gs)", e, self.ttl_s)
            self._on_evict(e, info)
        return evicted
