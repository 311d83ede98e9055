"""The kernel table, for plugin authors (the table lives in :mod:`host.interfaces.kernels`).

An op's body looks its implementation up with :func:`kernel_for` (``kernel_for("gguf_linear",
x.device.type)``). A plugin offers implementations by implementing the ``host_offer_kernels``
hook (``host.general``; any plugin may)::

    @hookimpl
    def host_offer_kernels(register, platform, config):
        if platform.device_type == "cpu":
            register("gguf_linear", "cpu", my_q4_kernel, name="my_amx", priority=20, reason="AMX tiles")

The highest ``priority`` registered for the input's device type wins, else the reference
registered under ``"*"`` (:data:`ANY_DEVICE`); ``host plugins list`` and ``host platform`` show
which one serves each op here, and why. Nothing is registered at import time.
"""

from __future__ import annotations

import host.core.plugins  # noqa: F401 - installs the table's filler (core/plugins/kernel_filler.py)
from host.interfaces.kernels import (
    ANY_DEVICE,
    KernelImpl,
    kernel_candidates,
    kernel_entry,
    kernel_for,
    kernel_report,
    kernel_table,
    register_kernel,
    registered,
    unregister_kernel,
)

__all__ = [
    "ANY_DEVICE",
    "KernelImpl",
    "kernel_candidates",
    "kernel_entry",
    "kernel_for",
    "kernel_report",
    "kernel_table",
    "register_kernel",
    "registered",
    "unregister_kernel",
]
