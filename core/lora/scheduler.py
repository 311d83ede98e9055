"""The ``max_loras`` cap: the running requests never use more than ``max_loras`` distinct adapters.

The worker holds ``max_loras`` adapter slots on the device, and every adapter a step uses must
sit in one (core/lora/slots.py). The scheduler keeps that true at admission: a waiting request
whose adapter is not among the running ones waits while the running ones already use
``max_loras`` adapters. It stays in the waiting queue, in its place (it is not failed, and the
requests behind it that fit, base-model ones among them, are admitted past it); it is admitted
once a running request's end frees an adapter. Base-model requests are never held back by
this.

An adapter is its ``(lora_int_id, digest)``, the key of the worker's slots: an adapter reloaded
with changed weights under the same id is a different one while requests of both run.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Hashable, Iterable

from host.contracts.messages import LoRAStats
from host.core.scheduler.feature import WAIT, SchedulerFeature

if TYPE_CHECKING:
    from host.contracts.messages import SchedulerStats
    from host.contracts.request import Request


def adapter_key(request: "Request") -> Hashable | None:
    """The adapter ``request`` runs with (its slot key), ``None`` for the base model."""
    lora = request.lora_request
    return None if lora is None else (lora.lora_int_id, lora.digest)


class LoRAFeature(SchedulerFeature):
    """One step's view of the adapters in use: :meth:`begin_admissions` with the running
    requests, then :meth:`admit` / :meth:`admitted` for each waiting request the step considers."""

    name = "lora"

    def __init__(self, max_loras: int) -> None:
        if not isinstance(max_loras, int) or max_loras < 1:
            raise ValueError(f"max_loras={max_loras!r} must be an integer >= 1 (--max-loras)")
        self.max_loras = max_loras
        self.active: set[Hashable] = set()

    def begin_admissions(self, running: Iterable["Request"]) -> None:
        """Start a step's admissions: the adapters of the requests running now."""
        self.active = {k for k in map(adapter_key, running) if k is not None}

    def admit(self, request: "Request") -> str | None:
        """``request`` may join the running ones unless that makes a ``max_loras + 1``-th adapter
        (then it waits, in its place)."""
        key = adapter_key(request)
        return None if key is None or key in self.active or len(self.active) < self.max_loras else WAIT

    def admitted(self, request: "Request") -> None:
        """``request`` joined the running ones: its adapter is in use."""
        key = adapter_key(request)
        if key is not None:
            self.active.add(key)


    def stats(self, stats: "SchedulerStats", running: list["Request"], waiting: Iterable["Request"]) -> None:
        stats.lora_stats = lora_stats(self.max_loras, running, waiting)


def lora_stats(max_loras: int, running: Iterable["Request"], waiting: Iterable["Request"]) -> LoRAStats:
    """The adapters in use, for ``/metrics`` (vLLM's ``lora_requests_info``): ``max_lora`` and,
    per adapter name, how many running and waiting requests use it."""

    def by_name(requests: Iterable["Request"]) -> dict[str, int]:
        return dict(Counter(r.lora_request.lora_name for r in requests if r.lora_request is not None))

    return LoRAStats(max_lora=max_loras, running=by_name(running), waiting=by_name(waiting))
