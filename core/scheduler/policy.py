"""Waiting-queue policies: which waiting request is admitted next and which running request is
preempted first.

- ``fcfs``: arrival order; a preempted request goes back to the front; the victim is the
  request admitted last (the tail of the running list).
- ``priority``: lower ``priority`` value first, ties by arrival time; the victim is the running
  request with the highest ``(priority, arrival_time)``.
"""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections import deque
from typing import Iterable, Iterator

from host.contracts.request import Request


class RequestQueue(ABC):
    """The waiting queue of a scheduler."""

    @abstractmethod
    def add_request(self, request: Request) -> None:
        """Queue a new request."""

    @abstractmethod
    def prepend_request(self, request: Request) -> None:
        """Put a preempted request back, ahead of requests that arrived after it."""

    @abstractmethod
    def peek_request(self) -> Request:
        """The request to admit next (IndexError when empty)."""

    @abstractmethod
    def pop_request(self) -> Request:
        """Remove and return the request to admit next."""

    @abstractmethod
    def remove_requests(self, requests: Iterable[Request]) -> None:
        """Remove these requests (aborts), wherever they are."""

    @abstractmethod
    def select_victim(self, running: list[Request]) -> Request:
        """The running request to preempt first."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __iter__(self) -> Iterator[Request]:
        """Requests in admission order."""

    def __bool__(self) -> bool:
        return len(self) > 0


class FCFSRequestQueue(RequestQueue):
    """First come, first served."""

    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def add_request(self, request: Request) -> None:
        self._queue.append(request)

    def prepend_request(self, request: Request) -> None:
        self._queue.appendleft(request)

    def peek_request(self) -> Request:
        if not self._queue:
            raise IndexError("the waiting queue is empty")
        return self._queue[0]

    def pop_request(self) -> Request:
        if not self._queue:
            raise IndexError("the waiting queue is empty")
        return self._queue.popleft()

    def remove_requests(self, requests: Iterable[Request]) -> None:
        drop = {id(r) for r in requests}
        if drop:
            self._queue = deque(r for r in self._queue if id(r) not in drop)

    def select_victim(self, running: list[Request]) -> Request:
        return running[-1]

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


class PriorityRequestQueue(RequestQueue):
    """Lower ``priority`` value first, then earlier arrival, then insertion order."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        self._counter = itertools.count()

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.priority, request.arrival_time, next(self._counter), request))

    def prepend_request(self, request: Request) -> None:
        # the (priority, arrival) key already puts it ahead of later arrivals
        self.add_request(request)

    def peek_request(self) -> Request:
        if not self._heap:
            raise IndexError("the waiting queue is empty")
        return self._heap[0][3]

    def pop_request(self) -> Request:
        if not self._heap:
            raise IndexError("the waiting queue is empty")
        return heapq.heappop(self._heap)[3]

    def remove_requests(self, requests: Iterable[Request]) -> None:
        drop = {id(r) for r in requests}
        if drop:
            self._heap = [e for e in self._heap if id(e[3]) not in drop]
            heapq.heapify(self._heap)

    def select_victim(self, running: list[Request]) -> Request:
        # ties go to the request admitted last
        return max(reversed(running), key=Request.sort_key)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (e[3] for e in sorted(self._heap))


_POLICIES: dict[str, type[RequestQueue]] = {
    "fcfs": FCFSRequestQueue,
    "priority": PriorityRequestQueue,
}


def create_request_queue(policy: str) -> RequestQueue:
    try:
        return _POLICIES[policy]()
    except KeyError:
        raise ValueError(f"policy={policy!r} is not supported; use one of {', '.join(_POLICIES)}") from None
