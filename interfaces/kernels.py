"""The kernel table: which implementation runs a named kernel op on a device type, and why.

A quantization method calls its ops through :func:`kernel_for` (``kernel_for("gguf_linear",
x.device.type)``) instead of importing a kernel, so a platform plugin can swap one kernel without
touching the method: it offers an implementation for its device type with a higher ``priority``
than what is there (the seed's ``KernelOverride`` idea, as a table instead of rebinding module
attributes). The op's owner offers its torch reference under device type ``"*"``, the fallback
for every device.

The table is filled through the ``host_offer_kernels`` hook (:mod:`host.hooks.general`), never at
import time: the plugin host installs a filler (:func:`set_filler`) that, on the first lookup in
a process, registers the core's own references and calls the hook of every loaded plugin with a
``register`` callback; the worker calls the hook again with its engine config before it prepares
a model. :func:`register_kernel` is that callback's target (and stays callable directly, for
tests). Each entry records who offered it (``source``) and why it serves (``reason``), which
``host plugins list`` and ``host platform`` print (:func:`kernel_report`).

Each op has one calling convention, fixed by the method that defines it (for example
``gguf_linear(x, qweight, qtype, bias) -> Tensor``); every implementation registered for it keeps
that convention. The table is per process: each worker process fills its own.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

ANY_DEVICE = "*"


@dataclass(frozen=True)
class KernelImpl:
    """One registered implementation of an op: ``reason`` says why it is offered (``"AVX2
    build"``), ``source`` who offered it (a plugin name, or ``"host.core"``)."""

    op: str
    device_type: str
    name: str
    priority: int
    impl: Callable[..., Any]
    reason: str = ""
    source: str = ""

    def why(self) -> str:
        """``"priority 10 on cpu: AVX2 build"`` or ``"reference for any device: torch"``."""
        where = "reference for any device" if self.device_type == ANY_DEVICE else f"priority {self.priority} on {self.device_type}"
        return f"{where}: {self.reason}" if self.reason else where


_TABLE: dict[tuple[str, str], list[KernelImpl]] = {}
_LOCK = threading.RLock()
# the plugin host's filler (set_filler) and whether the table needs it before the next lookup
_FILLER: list[Callable[[], None]] = []
_STALE = [True]


def set_filler(fill: Callable[[], None] | None) -> None:
    """Install ``fill`` (the plugin host's: core references, then the ``host_offer_kernels`` hook),
    called before the first lookup and after :func:`mark_stale`; ``None`` removes it."""
    with _LOCK:
        _FILLER[:] = [] if fill is None else [fill]
        _STALE[0] = True


def mark_stale() -> None:
    """The next lookup calls the filler first (new plugins were loaded, a new plugin host)."""
    _STALE[0] = True


def ensure_filled() -> None:
    """Run the filler if the table is stale (a cheap check once it is not)."""
    if not _STALE[0]:
        return
    with _LOCK:
        if not _STALE[0]:
            return
        _STALE[0] = False  # first: the filler's own lookups must not re-enter it
        for fill in list(_FILLER):
            try:
                fill()
            except BaseException:
                _STALE[0] = True
                raise


def register_kernel(
    op: str, device_type: str, impl: Callable[..., Any], *, name: str, priority: int = 0, reason: str = "", source: str = ""
) -> None:
    """Offer ``impl`` for ``op`` on ``device_type`` (``"*"``: any device, the reference).

    The highest ``priority`` wins; registering the same ``name`` again for the same op and device
    replaces the earlier entry (the hook runs again for each engine config, and a platform that
    prepares a second model re-registers freely). ``reason`` is the one-line why it serves."""
    if not op or not device_type or not name:
        raise ValueError("register_kernel needs an op, a device type and a name, e.g. ('gguf_linear', 'cpu', name='cpu_avx2')")
    if not callable(impl):
        raise ValueError(f"register_kernel({op!r}, {device_type!r}): impl {impl!r} is not callable")
    entry = KernelImpl(op, device_type, name, int(priority), impl, str(reason), str(source))
    with _LOCK:
        entries = [e for e in _TABLE.get((op, device_type), []) if e.name != name]
        entries.append(entry)
        entries.sort(key=lambda e: -e.priority)
        _TABLE[(op, device_type)] = entries


def unregister_kernel(op: str, device_type: str, name: str) -> None:
    """Remove one implementation (tests; a platform that finds its kernels unusable)."""
    with _LOCK:
        entries = [e for e in _TABLE.get((op, device_type), []) if e.name != name]
        _TABLE[(op, device_type)] = entries


def registered() -> list[KernelImpl]:
    """Every entry now in the table, without filling it first (tests: nothing at import time)."""
    with _LOCK:
        return [e for _, entries in sorted(_TABLE.items()) for e in entries]


def kernel_candidates(op: str, device_type: str, *, fill: bool = True) -> list[KernelImpl]:
    """The implementations that could run ``op`` on ``device_type``, the one that runs first:
    those registered for the device type (best first), then the references (``"*"``).
    ``fill=False`` reads the table as it is (a caller that filled it from its own plugin host)."""
    if fill:
        ensure_filled()
    with _LOCK:
        own = list(_TABLE.get((op, device_type), [])) if device_type != ANY_DEVICE else []
        return own + list(_TABLE.get((op, ANY_DEVICE), []))


def kernel_entry(op: str, device_type: str) -> KernelImpl:
    """The implementation that runs ``op`` on ``device_type``: the best one registered for that
    device type, else the best registered for ``"*"``. No implementation at all is a ``KeyError``
    naming the op."""
    ensure_filled()
    with _LOCK:
        for key in ((op, device_type), (op, ANY_DEVICE)):
            entries = _TABLE.get(key)
            if entries:
                return entries[0]
    raise KeyError(
        f"no implementation of kernel op {op!r} for device type {device_type!r}; the plugin that defines it "
        "offers a torch reference through the host_offer_kernels hook (is it loaded in this process?)"
    )


def kernel_for(op: str, device_type: str) -> Callable[..., Any]:
    """The callable that runs ``op`` on ``device_type`` (see :func:`kernel_entry`)."""
    return kernel_entry(op, device_type).impl


def kernel_table() -> dict[str, dict[str, list[str]]]:
    """``{op: {device_type: [names, best first]}}``, for ``host platform`` and logs."""
    ensure_filled()
    with _LOCK:
        out: dict[str, dict[str, list[str]]] = {}
        for (op, device), entries in sorted(_TABLE.items()):
            if entries:
                out.setdefault(op, {})[device] = [e.name for e in entries]
        return out


def kernel_report(device_type: str, *, fill: bool = True) -> list[dict[str, Any]]:
    """Per op, which kernel serves it on ``device_type`` and why, and the runners-up in the order
    they would take over: ``[{"op", "device_type", "serves", "source", "why", "runners_up":
    [{"name", "device_type", "source", "why"}]}]`` sorted by op (``host plugins list``, ``host
    platform``). ``fill=False``: as :func:`kernel_candidates`."""
    if fill:
        ensure_filled()
    with _LOCK:
        ops = sorted({op for (op, _), entries in _TABLE.items() if entries})
    rows = []
    for op in ops:
        candidates = kernel_candidates(op, device_type, fill=False)
        if not candidates:
            continue
        best, rest = candidates[0], candidates[1:]
        rows.append({
            "op": op,
            "device_type": device_type,
            "serves": best.name,
            "source": best.source,
            "why": best.why(),
            "runners_up": [{"name": e.name, "device_type": e.device_type, "source": e.source, "why": e.why()} for e in rest],
        })
    return rows
