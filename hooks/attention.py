"""Hooks of the ``host.attention_backends`` family: paged-attention kernels.

Loaded in the engine process (which selects a backend) and in worker processes (which run it).
"""

from __future__ import annotations

from typing import Any, Callable

from host.hooks.markers import hookspec

# this family's entry-point group and where it loads (gathered by host.hooks.groups)
GROUP = "host.attention_backends"
LOADED_IN = ("engine", "worker")
LAZY_IN: tuple[str, ...] = ()
SUMMARY = "paged-attention backends"


@hookspec
def host_register_attention_backends(register: Callable[..., None]) -> None:
    """Offer :class:`host.sdk.AttentionBackend` subclasses.

    Call ``register(backend_class)``; the backend's ``name`` is its key (``--attention-backend``
    chooses by that name). Each backend declares what it supports (device types, dtypes, head
    sizes, block sizes, sliding window); the platform picks the first one that fits.
    """


@hookspec(firstresult=True)
def host_select_attention_backend(
    platform: Any, requirements: Any, candidates: list[Any]
) -> str | None:
    """Pick the attention backend for this model, or return ``None`` to let the platform pick.

    ``requirements`` is a :class:`host.sdk.AttentionRequirements` (dtype, head size, block
    size, sliding window, device type); ``candidates`` are the registered backend classes that
    support them, in platform priority order. Return one backend ``name``. The first plugin that
    returns a name wins.
    """
