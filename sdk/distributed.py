"""What an executor plugin needs to drive worker processes it starts itself (the ``mp`` and ``ray``
executors): the engine's shared-memory step broadcast and the workers' response queue
(:mod:`host.core.distributed.message_queue`), and the worker main that reads the one and answers on
the other (:mod:`host.core.worker.worker_loop`).

Stable re-exports of the core, unchanged; like :mod:`host.sdk.runtime` this module is not imported by
``host.sdk`` itself.
"""

from host.core.distributed.message_queue import (
    BroadcastHandle,
    MessageQueue,
    ResponseHandle,
    ResponseQueue,
)
from host.core.plugins.processes import spawn_process
from host.core.worker.worker_loop import READY, SHUTDOWN, WorkerProc, run_worker

__all__ = [
    "READY",
    "SHUTDOWN",
    "BroadcastHandle",
    "MessageQueue",
    "ResponseHandle",
    "ResponseQueue",
    "WorkerProc",
    "run_worker",
    "spawn_process",
]
