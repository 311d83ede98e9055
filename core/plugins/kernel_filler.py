"""The kernel table's filler: on the first lookup of a kernel in a process (and after plugins
loaded since), the plugin host offers the kernels of the groups that have them, for the
process's platform. Installed when :mod:`host.core.plugins` is first imported; here rather than
in the manager because it needs the platform, which needs the manager."""

from __future__ import annotations

from host.core.plugins.manager import get_plugin_host
from host.core.plugins.platform import current_platform
from host.hooks.groups import GENERAL_GROUP, PLATFORMS_GROUP
from host.hooks.quantization import GROUP as QUANTIZATION_GROUP
from host.interfaces import kernels as kernel_table

KERNEL_GROUPS = (GENERAL_GROUP, PLATFORMS_GROUP, QUANTIZATION_GROUP)  # the groups whose plugins offer kernels


def fill_kernel_table() -> None:
    """The kernel table's filler (installed below): this process's plugin host loads the groups
    that offer kernels and offers those of the plugins not offered yet, for the process's
    platform with the default settings (``config=None``)."""
    host = get_plugin_host()
    missing = [g for g in KERNEL_GROUPS if g not in host.loaded_groups]
    if missing:  # (a failure loaded earlier was raised then, not at every lookup)
        host.load_groups(missing)
    host.offer_kernels(current_platform(), None, only_new=True)


kernel_table.set_filler(fill_kernel_table)
