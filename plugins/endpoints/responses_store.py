"""The in-memory store behind ``store: true``, ``previous_response_id`` and ``GET`` / ``DELETE
/v1/responses/{id}``: bounded in entries (``--responses-store-size``; the oldest goes first)
and in age (``--responses-store-ttl`` seconds from creation; an expired entry is a miss).

Each entry keeps the response object as the client received it and the conversation that led to
it (its input items, those of every response before it in the chain included), so a chain
survives the eviction of its earlier responses. The items of a chain are shared between its
entries (a new entry's list holds references to the previous one's items, no copies), so a long
chain costs a list of references per turn, not the whole conversation again.

The store lives in the API process's event loop and is not locked: every call is synchronous.
A server restart empties it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class StoredResponse:
    """One stored response: the object a client reads back, and the items of the conversation
    that produced it (the next turn's prompt begins with them, then its ``output``)."""

    response: dict[str, Any]
    history: list[dict[str, Any]]
    created: float

    def conversation(self) -> list[dict[str, Any]]:
        """The items a response continuing this one starts from: the history, then the output."""
        return self.history + list(self.response["output"])


class ResponseStore:
    """At most ``size`` responses (0 stores none), each for ``ttl`` seconds; ``clock`` is
    ``time.monotonic`` unless a test gives its own."""

    def __init__(self, size: int, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        if size < 0 or ttl <= 0:
            raise ValueError(f"a response store needs size >= 0 and ttl > 0 (got size={size}, ttl={ttl})")
        self.size = size
        self.ttl = ttl
        self.clock = clock
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    @property
    def enabled(self) -> bool:
        return self.size > 0

    def put(self, response_id: str, response: dict[str, Any], history: list[dict[str, Any]]) -> bool:
        """Store a response (evicting the oldest beyond ``size``); ``False`` when the store holds none."""
        if not self.enabled:
            return False
        self._expire()
        self._entries.pop(response_id, None)
        self._entries[response_id] = StoredResponse(response, history, self.clock())
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return True

    def get(self, response_id: str) -> StoredResponse | None:
        """The entry, or ``None`` when it was never stored, was deleted, evicted or expired."""
        self._expire()
        return self._entries.get(response_id)

    def delete(self, response_id: str) -> bool:
        """Remove an entry; ``False`` when there was none."""
        self._expire()
        return self._entries.pop(response_id, None) is not None

    def _expire(self) -> None:
        """Drop the entries older than ``ttl`` (the oldest come first)."""
        cutoff = self.clock() - self.ttl
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if entry.created > cutoff:
                break
            del self._entries[key]
