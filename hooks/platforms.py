"""Hooks of the ``host.platforms`` family: the hardware a process runs on.

Loaded in the engine and worker processes at start-up, and lazily in the API process the first
time it needs to know the platform.
"""

from __future__ import annotations

from typing import Callable

from host.hooks.markers import hookspec

# this family's entry-point group and where it loads (gathered by host.hooks.groups)
GROUP = "host.platforms"
LOADED_IN = ("api", "engine", "worker")
LAZY_IN: tuple[str, ...] = ("api",)
SUMMARY = "hardware platforms"


@hookspec
def host_register_platforms(register: Callable[..., None]) -> None:
    """Offer one or more :class:`host.sdk.Platform` subclasses.

    Call ``register(platform_class)``. The host then asks each class ``detect()`` (a cheap,
    side-effect-free "is this hardware here?") and resolves one platform per process:
    ``HOST_PLATFORM`` / ``--platform`` forces a name; otherwise exactly one detected third-party
    platform wins over the built-ins; two detected third-party platforms are an error naming
    both; among built-ins, ``cuda`` and ``rocm`` are preferred over ``cpu``. An exception raised
    by ``detect()`` is recorded and shown by ``host platform``, never swallowed.
    """
