"""A same-host shared-memory all-reduce for the CPU ranks of one group (seed §8.2 on CPU).

Gloo reduces a tensor over loopback TCP: tens of microseconds per call even for one decode row.
The ranks of a tensor-parallel group on one machine can instead meet in one shared-memory
segment: each rank copies its tensor into its own slot, publishes a sequence number, waits for
every peer's number, and sums the slots itself.

The contract is the seed's: calling the object returns the sum, or ``None`` to decline, and the
caller (:meth:`GroupCoordinator.all_reduce`) then reduces over the device group instead. It declines
when it is disabled or the tensor is not one it handles:

- dtype fp32, bf16 or fp16 (bf16 and fp16 are summed in fp32 and rounded once);
- contiguous;
- ``nbytes <= max_bytes`` (``HOST_SHM_ALLREDUCE_MAX_BYTES``, default 8 MiB per rank);
- a group of 2 to :data:`MAX_WORLD_SIZE` ranks.

The seed's CUDA filter "nbytes a multiple of 16" is not applied: it exists for the GPU kernel's
16-byte vector loads, and here the slots are 64-byte aligned and torch's CPU adds take any length.
The decision depends only on the tensor's dtype, layout and size, which every rank of a tensor-
parallel all-reduce shares, so all ranks take the same path.

Results are bit-identical on every rank: each rank adds the slots in the same fixed order
(rank 0, 1, 2, ...). With two ranks in fp32 the sum equals gloo's exactly (``a + b`` has one
rounding whichever way round); with more ranks it may differ from gloo's order in the last bit.

Synchronisation: one int64 counter per rank (own cache line) holds the last sequence number the
rank published; two sets of slots alternate by sequence parity. Entering call ``k + 2`` a rank has
already seen every peer publish ``k + 1``, and a peer publishes ``k + 1`` only after it finished
reading the slots of call ``k``, so a slot is never overwritten while a peer still reads it. The
stores and loads rely on x86-64's total store order (the copy into the slot is visible before the
counter, the reads of call ``k`` complete before the counter of ``k + 1``); on other machines the
communicator disables itself and gloo reduces. A waiting rank spins briefly, then yields the
core, then (after 1 ms) sleeps 50 µs per poll, and after ``timeout_s`` (default 60 s,
``HOST_SHM_ALLREDUCE_TIMEOUT``) raises ``RuntimeError`` naming the ranks that never arrived.

Life cycle: built collectively by every rank of the group (:func:`install_shm_all_reduce`).
Group ordinal 0 creates ``/dev/shm/host-shmar-<pid>-<group>-<token>`` with its blocks reserved
(``posix_fallocate``, so a full ``/dev/shm`` is a clean refusal, not a ``SIGBUS`` later), the others
map it, and all ranks agree with one CPU-group ``all_gather_object`` of their ok flags: any failure
disables it on every rank (a group spanning machines fails to map the name on the far side, so
it reduces over gloo). Right after the agreement the owner unlinks the name; the mapping lives
on in every rank until it closes or exits. So nothing is left in ``/dev/shm`` after start-up, even
when a rank is killed with SIGKILL later. Only a SIGKILL of the owner inside the few milliseconds
between creating and agreeing leaves the file behind; the next owner on the machine removes
segments of dead owners (the pid is in the name) before creating its own. An agreement that fails
(a peer died during it) unlinks and unmaps the segment before the error goes on.
"""

from __future__ import annotations

import atexit
import logging
import mmap
import os
import platform
import secrets
import time
from typing import Any

import torch

logger = logging.getLogger("host.distributed")

DEFAULT_MAX_BYTES = 8 << 20
DEFAULT_TIMEOUT_S = 60.0
MAX_WORLD_SIZE = 8
SHM_DIR = "/dev/shm"
NAME_PREFIX = "host-shmar-"
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

_HEADER = 4096  # the counters, one 64-byte line per rank; the slots start page-aligned after it
_LINE_WORDS = 8  # int64 words per cache line
_SPIN_POLLS = 1000  # polls (about 0.2 ms) before yielding the core
_YIELD_S = 0.001  # waited this long: sleep between polls (the peer is not running; do not burn its core)
_TSO_MACHINES = {"x86_64", "amd64"}  # 64-bit: the int64 counters are stored in one instruction


def _env_number(name: str, default: float, kind: type) -> Any:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = kind(raw)
    except ValueError:
        value = None
    if value is None or value <= 0:
        raise ValueError(f"{name}={raw!r} is not a positive {kind.__name__}; set it to e.g. {kind(default)} or unset it")
    return value


class _Segment:
    """The mapped segment of one group; ``close`` unmaps it (and unlinks it while still named)."""

    def __init__(self, path: str, size: int, create: bool) -> None:
        self.path: str | None = path
        self.size = size
        self.mm: mmap.mmap | None = None
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.posix_fallocate(fd, 0, size)
            else:
                found = os.fstat(fd).st_size
                if found != size:
                    raise OSError(f"{path} holds {found} bytes, expected {size}")
                self.path = None  # only the owner unlinks
            self.mm = mmap.mmap(fd, size)
        except OSError:
            if create:
                os.unlink(path)
            raise
        finally:
            os.close(fd)
        atexit.register(self.close)

    def unlink(self) -> None:
        if self.path is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self.path = None

    def close(self) -> None:
        self.unlink()
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:  # a view still exported: the mapping goes with the process
                pass
            self.mm = None
        atexit.unregister(self.close)


def _sweep_dead_owners(shm_dir: str) -> None:
    """Remove segments whose owner died between creating and agreeing (SIGKILL in that window)."""
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return
    for name in names:
        if not name.startswith(NAME_PREFIX):
            continue
        pid_text = name[len(NAME_PREFIX):].split("-", 1)[0]
        if not pid_text.isdigit():
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            try:
                os.unlink(os.path.join(shm_dir, name))
            except OSError:
                pass
        except OSError:  # alive, another user's
            pass


class ShmAllReduce:
    """The shared-memory all-reduce of one group: ``shm(t)`` is the sum over the group (written
    into ``t``, which is returned) or ``None`` (declined: reduce over the device group instead).

    ``group`` is the :class:`~host.core.distributed.group.GroupCoordinator` (its CPU group carries
    the set-up agreement). Every rank of the group must construct it, in the same order as the
    group's other collectives; afterwards ``enabled`` is the same on every rank. ``max_bytes`` and
    ``timeout_s`` default to ``HOST_SHM_ALLREDUCE_MAX_BYTES`` / ``HOST_SHM_ALLREDUCE_TIMEOUT``;
    group ordinal 0's ``max_bytes`` is the one used. ``shm_dir`` is where segments live.
    """

    def __init__(
        self,
        group: Any,
        max_bytes: int | None = None,
        timeout_s: float | None = None,
        shm_dir: str = SHM_DIR,
    ) -> None:
        self.group = group
        self.world_size: int = group.world_size
        self.rank_in_group: int = group.rank_in_group
        self.timeout_s = float(timeout_s) if timeout_s is not None else _env_number("HOST_SHM_ALLREDUCE_TIMEOUT", DEFAULT_TIMEOUT_S, float)
        wanted = int(max_bytes) if max_bytes is not None else _env_number("HOST_SHM_ALLREDUCE_MAX_BYTES", DEFAULT_MAX_BYTES, int)
        if wanted <= 0:
            raise ValueError(f"max_bytes={wanted} must be positive (bytes per rank, e.g. {DEFAULT_MAX_BYTES})")
        self.max_bytes = 0
        self.enabled = False
        self.reason = ""
        self._seq = 0
        self._broken = ""
        self._segment: _Segment | None = None
        self._counters: memoryview | None = None
        self._buffer: torch.Tensor | None = None
        self._slots: dict[tuple[int, int, torch.dtype], torch.Tensor] = {}
        self._shaped: dict[tuple[int, torch.dtype, torch.Size], list[torch.Tensor]] = {}
        self._peer_words = [r * _LINE_WORDS for r in range(self.world_size) if r != self.rank_in_group]
        if self.world_size < 2:
            self.reason = "a one-rank group needs no all-reduce"
            return
        self._setup(-(-wanted // 64) * 64, shm_dir)

    # -- set-up: create / attach, then agree -----------------------------------------------------
    def _refusal(self) -> str:
        if self.world_size > MAX_WORLD_SIZE:
            return f"group of {self.world_size} ranks (at most {MAX_WORLD_SIZE})"
        if platform.machine().lower() not in _TSO_MACHINES:
            return f"{platform.machine()} is not x86-64 (the counters rely on its store order)"
        return ""

    def _setup(self, max_bytes: int, shm_dir: str) -> None:
        reason = self._refusal()
        offer = None
        if self.rank_in_group == 0 and not reason:
            try:
                _sweep_dead_owners(shm_dir)
                name = f"{NAME_PREFIX}{os.getpid()}-{self.group.name}-{'_'.join(map(str, self.group.ranks))}-{secrets.token_hex(4)}"
                self._map(os.path.join(shm_dir, name), max_bytes, create=True)
                offer = (name, max_bytes)
            except OSError as e:
                reason = f"cannot create a {self._size(max_bytes)}-byte segment in {shm_dir}: {e}"
        try:
            offer = self.group.broadcast_object(offer, src=0)
            if self.rank_in_group != 0 and not reason:
                if offer is None:
                    reason = "group ordinal 0 could not create the segment"
                else:
                    try:
                        self._map(os.path.join(shm_dir, offer[0]), offer[1], create=False)
                    except OSError as e:
                        reason = f"cannot map {offer[0]} from {shm_dir}: {e}"
            verdicts = self.group.all_gather_object(reason)
        except BaseException:
            self._release()  # a peer failed the agreement (died, timed out): leave no named segment behind
            raise
        if self._segment is not None:
            self._segment.unlink()  # every rank has mapped it (or given up): the name is no longer needed
        failed = [(i, r) for i, r in enumerate(verdicts) if r]
        if failed:
            self.reason = "; ".join(f"group ordinal {i}: {r}" for i, r in failed)
            self._release()
            if self.rank_in_group == 0:
                logger.info("Shared-memory all-reduce off for group %s %s (gloo reduces): %s", self.group.name, self.group.ranks, self.reason)
            return
        self.enabled = True
        if self.rank_in_group == 0:
            logger.info("Shared-memory all-reduce on for group %s %s (up to %d bytes per call)", self.group.name, self.group.ranks, self.max_bytes)

    def _size(self, max_bytes: int) -> int:
        return _HEADER + 2 * self.world_size * max_bytes

    def _map(self, path: str, max_bytes: int, create: bool) -> None:
        if self.world_size * 64 > _HEADER:
            raise OSError(f"{self.world_size} ranks do not fit the header")
        self._segment = _Segment(path, self._size(max_bytes), create)
        self.max_bytes = max_bytes
        self._counters = memoryview(self._segment.mm)[: self.world_size * 64].cast("q")
        # every slot as a flat tensor of each dtype, made once outside inference mode: a view made
        # inside it could not be written by a later call outside it (and the reverse works)
        with torch.inference_mode(False):
            self._buffer = torch.frombuffer(self._segment.mm, dtype=torch.uint8)
            for phase in (0, 1):
                for rank in range(self.world_size):
                    start = _HEADER + (phase * self.world_size + rank) * max_bytes
                    for dtype in SUPPORTED_DTYPES:
                        self._slots[phase, rank, dtype] = self._buffer[start : start + max_bytes].view(dtype)

    # -- the all-reduce --------------------------------------------------------------------------
    def accepts(self, t: torch.Tensor) -> bool:
        """Whether ``t`` takes the shared-memory path (see the module docstring's filters)."""
        return (
            self.enabled
            and t.device.type == "cpu"
            and t.dtype in SUPPORTED_DTYPES
            and t.is_contiguous()
            and t.numel() * t.element_size() <= self.max_bytes
        )

    def __call__(self, t: torch.Tensor) -> torch.Tensor | None:
        if self._broken:
            raise RuntimeError(self._broken)
        if not self.accepts(t):
            return None
        if t.numel() == 0:
            return t
        self._seq += 1
        seq, me = self._seq, self.rank_in_group
        slots = self._views(seq & 1, t)
        slots[me].copy_(t)
        self._counters[me * _LINE_WORDS] = seq  # publish: the slot's bytes are stored before this
        self._wait(seq)
        # the sum in rank order ((s0 + s1) + s2) + ...; ranks 0 and 1 start from their own ``t``
        # (s0 + s1 == s1 + s0 exactly), the others from the two slots
        if t.dtype == torch.float32:
            acc = t.add_(slots[1 - me]) if me < 2 else torch.add(slots[0], slots[1], out=t)
        else:
            acc = t.float().add_(slots[1 - me]) if me < 2 else slots[0].float().add_(slots[1])
        for r in range(2, self.world_size):
            acc.add_(slots[r])
        if acc is not t:
            t.copy_(acc)
        return t

    def _views(self, phase: int, t: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's slot of set ``phase`` viewed with ``t``'s dtype and shape (cached per shape)."""
        key = (phase, t.dtype, t.shape)
        views = self._shaped.get(key)
        if views is None:
            if len(self._shaped) >= 512:  # many distinct shapes (prefill chunks): start over
                self._shaped.clear()
            n = t.numel()
            with torch.inference_mode(False):  # usable inside and outside inference mode
                views = [self._slots[phase, r, t.dtype][:n].view(t.shape) for r in range(self.world_size)]
            self._shaped[key] = views
        return views

    def _wait(self, seq: int) -> None:
        counters = self._counters
        pending = [i for i in self._peer_words if counters[i] < seq]
        if not pending:
            return
        polls, started = 0, 0.0
        while True:
            pending = [i for i in pending if counters[i] < seq]
            if not pending:
                return
            polls += 1
            if polls <= _SPIN_POLLS:
                continue
            now = time.monotonic()
            if not started:
                started = now
            waited = now - started
            if waited > self.timeout_s:
                names = ", ".join(f"group ordinal {i // _LINE_WORDS} (global rank {self.group.ranks[i // _LINE_WORDS]})" for i in pending)
                self._broken = (
                    f"shared-memory all-reduce #{seq} of group {self.group.name} {self.group.ranks}: "
                    f"{names} did not arrive within {self.timeout_s:g} s; the peer process died or hangs "
                    f"(set HOST_SHM_ALLREDUCE=0 to reduce over gloo instead)"
                )
                raise RuntimeError(self._broken)  # and on every later call: the ranks are out of step
            if waited > _YIELD_S:
                time.sleep(5e-5)
            else:
                os.sched_yield()

    # -- teardown --------------------------------------------------------------------------------
    def _release(self) -> None:
        self._shaped.clear()
        self._slots.clear()
        self._buffer = None
        if self._counters is not None:
            self._counters.release()
            self._counters = None
        if self._segment is not None:
            self._segment.close()
            self._segment = None

    def close(self) -> None:
        """Unmap the segment (and unlink it if still named); later calls decline. Idempotent."""
        self.enabled = False
        self._release()


def install_shm_all_reduce(group: Any) -> ShmAllReduce | None:
    """Build the shared-memory all-reduce for ``group`` (collective: every rank of the group calls
    it) and install it as the group's fast path; ``None`` when it is off on every rank, or not
    built at all with ``HOST_SHM_ALLREDUCE=0`` (the same environment on every rank)."""
    if group.world_size < 2 or os.environ.get("HOST_SHM_ALLREDUCE", "1") == "0":
        return None
    shm = ShmAllReduce(group)
    if not shm.enabled:
        return None
    group.set_fast_all_reduce(shm, shm.close)
    return shm
