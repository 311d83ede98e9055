"""The consumer's transfer handles and their state machine.

A handle is one request's pull, running in a background thread: ``state()`` is ``PROC`` while
it runs, ``DONE`` when every byte landed in the local blocks, ``FAILED`` otherwise.
:func:`pop_done_transfers` polls every handle: DONE and FAILED handles are released and
reported; PROC ones wait for the next poll. Releasing checks that nothing writes into the
blocks any more; if it cannot say so (it raises), the handle and its blocks are kept and the
release retried at the next poll — a block freed while a write may still land would corrupt
whichever request gets it next ("rather leak, for a while, than misuse").
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass, field

logger = logging.getLogger("host.kv_connectors.p2p")

PROC, DONE, FAILED = "PROC", "DONE", "FAILED"


@dataclass
class TransferHandle:
    req_id: str
    engine_id: str
    local_block_ids: list[int]
    future: Future
    failure_logged: bool = field(default=False, repr=False)

    def state(self) -> str:
        if not self.future.done():
            return PROC
        return FAILED if self.future.cancelled() or self.future.exception() is not None else DONE

    def error(self) -> BaseException | None:
        if self.future.cancelled():
            return RuntimeError("transfer cancelled")
        return self.future.exception() if self.future.done() else None

    def release(self) -> None:
        """Raises unless the transfer's thread is finished with the blocks."""
        if not self.future.done():
            raise RuntimeError(f"transfer of {self.req_id!r} still running")


@dataclass
class PollResult:
    done: dict[str, int] = field(default_factory=dict)  # req id -> bytes loaded
    failed: dict[str, list[int]] = field(default_factory=dict)  # req id -> its local blocks


def try_release(handle: TransferHandle) -> bool:
    try:
        handle.release()
        return True
    except Exception as e:
        logger.warning("p2p KV transfer_release_failed for request %s (%s): retaining handle and blocks until "
                       "release succeeds", handle.req_id, e)
        return False


def pop_done_transfers(handles: dict[str, TransferHandle]) -> PollResult:
    """Poll ``handles`` (removing the released ones) and return what finished."""
    out = PollResult()
    for req_id, handle in list(handles.items()):
        state = handle.state()
        if state == PROC:
            continue
        if state == FAILED and not handle.failure_logged:
            handle.failure_logged = True
            logger.warning("p2p KV transfer_failed for request %s from engine %s: %s", req_id, handle.engine_id,
                           handle.error())
        if not try_release(handle):
            continue
        del handles[req_id]
        if state == DONE:
            out.done[req_id] = int(handle.future.result() or 0)
        else:
            out.failed[req_id] = list(handle.local_block_ids)
    return out
