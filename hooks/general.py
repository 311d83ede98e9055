"""Hooks of the ``host.general`` family: loaded in every process (api, engine, worker).

Any plugin module, whatever its group, may also implement these hooks. They run once per
process, but in *every* process that loads them, so each implementation must be re-entrant:
calling it a second time in a fresh process must give the same result without side effects
piling up.
"""

from __future__ import annotations

from typing import Any, Callable

from host.hooks.markers import hookspec

# this family's entry-point group and where it loads (gathered by host.hooks.groups)
GROUP = "host.general"
LOADED_IN = ("api", "engine", "worker")
LAZY_IN: tuple[str, ...] = ()
SUMMARY = "kernels, config tweaks, startup"


@hookspec
def host_adjust_config(config: Any) -> None:
    """Adjust the engine configuration in place before it is frozen.

    Called in every process after command-line flags and environment variables are parsed and
    before the platform validates the config. Change only fields you own; never replace the
    object. Raise ``ValueError`` naming the field and the fix for a config you cannot serve.
    """


@hookspec
def host_startup(process: str) -> None:
    """Run a per-process side effect once the process has loaded its plugin groups.

    ``process`` is ``"api"``, ``"engine"`` or ``"worker"``. The host calls this exactly once
    per process, after every group of that process is loaded and validated; it is called again
    in each new process, so it must be re-entrant.
    """


@hookspec
def host_offer_kernels(register: Callable[..., None], platform: Any, config: Any) -> None:
    """Offer kernel implementations for the kernel table (:mod:`host.sdk.kernels`).

    Call ``register(op, device_type, impl, *, name, priority=0, reason="")`` once per
    implementation: ``impl`` runs ``op`` (with the op's one calling convention) on tensors of
    ``device_type`` (``"*"``: a reference for any device); the highest ``priority`` registered for
    the tensor's device type serves, else the best ``"*"`` entry. ``reason`` is one line on why it
    serves (``"AVX2 build"``), shown with the plugin's name by ``host plugins list`` and ``host
    platform``. ``platform`` is the process's resolved :class:`host.sdk.Platform` (register device
    kernels only when it is yours); ``config`` is the engine config of the model a worker is about
    to prepare, or ``None`` when the table is read outside an engine (register what serves with
    the default settings). The host calls this on the first lookup in a process (with ``config``
    ``None``, for the plugins loaded then and again for plugins loaded later) and again with the
    engine config before each model is prepared, so it must be re-entrant: registering a ``name``
    again for the same op and device replaces the earlier entry. Nothing may register at import
    time. The host's own references (the LoRA op's torch path) are registered the same way first.
    """
