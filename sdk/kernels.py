"""The kernel table: which implementation runs a named kernel op on a device type.

A quantization method calls its ops through :func:`kernel_for` (``kernel_for("gguf_linear",
x.device.type)``) instead of importing a kernel, so a platform plugin can swap one kernel without
touching the method: it calls :func:`register_kernel` for its device type with a higher
``priority`` than what is there (the seed's ``KernelOverride`` idea, as a table instead of
rebinding module attributes). The method registers its torch reference under device type
``"*"``, the fallback for every device.

Each op has one calling convention, fixed by the method that defines it (for example
``gguf_linear(x, qweight, qtype, bias) -> Tensor``); every implementation registered for it keeps
that convention. The table is per process: each worker process's platform registers its own.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

ANY_DEVICE = "*"


@dataclass(frozen=True)
class KernelImpl:
    """One registered implementation of an op."""

    op: str
    device_type: str
    name: str
    priority: int
    impl: Callable[..., Any]


_TABLE: dict[tuple[str, str], list[KernelImpl]] = {}
_LOCK = threading.Lock()


def register_kernel(op: str, device_type: str, impl: Callable[..., Any], *, name: str, priority: int = 0) -> None:
    """Offer ``impl`` for ``op`` on ``device_type`` (``"*"``: any device, the reference).

    The highest ``priority`` wins; registering the same ``name`` again for the same op and device
    replaces the earlier entry (a platform that prepares a second model re-registers freely)."""
    if not op or not device_type or not name:
        raise ValueError("register_kernel needs an op, a device type and a name, e.g. ('gguf_linear', 'cpu', name='cpu_avx2')")
    if not callable(impl):
        raise ValueError(f"register_kernel({op!r}, {device_type!r}): impl {impl!r} is not callable")
    entry = KernelImpl(op, device_type, name, int(priority), impl)
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


def kernel_entry(op: str, device_type: str) -> KernelImpl:
    """The implementation that runs ``op`` on ``device_type``: the best one registered for that
    device type, else the best registered for ``"*"``. No implementation at all is a ``KeyError``
    naming the op."""
    with _LOCK:
        for key in ((op, device_type), (op, ANY_DEVICE)):
            entries = _TABLE.get(key)
            if entries:
                return entries[0]
    raise KeyError(
        f"no implementation of kernel op {op!r} for device type {device_type!r}; the quantization method "
        "that uses it registers a torch reference when its plugin loads (is it loaded in this process?)"
    )


def kernel_for(op: str, device_type: str) -> Callable[..., Any]:
    """The callable that runs ``op`` on ``device_type`` (see :func:`kernel_entry`)."""
    return kernel_entry(op, device_type).impl


def kernel_table() -> dict[str, dict[str, list[str]]]:
    """``{op: {device_type: [names, best first]}}``, for ``host platform`` and logs."""
    with _LOCK:
        out: dict[str, dict[str, list[str]]] = {}
        for (op, device), entries in sorted(_TABLE.items()):
            if entries:
                out.setdefault(op, {})[device] = [e.name for e in entries]
        return out
