"""Hooks of the ``host.kv_connectors`` family: moving KV cache between instances.

Loaded in the engine process (the connector's scheduler role) and in worker processes (its worker
role).
"""

from __future__ import annotations

from typing import Callable

from host.hooks.markers import hookspec

# this family's entry-point group and where it loads (gathered by host.hooks.groups)
GROUP = "host.kv_connectors"
LOADED_IN = ("engine", "worker")
LAZY_IN: tuple[str, ...] = ()
SUMMARY = "KV transfer connectors"


@hookspec
def host_register_kv_connectors(register: Callable[..., None]) -> None:
    """Offer :class:`host.sdk.KVConnector` subclasses.

    Call ``register(connector_class)``; the connector's ``name`` is the key an engine setting
    selects it by (that setting comes with the issue that wires KV transfer into the engine).
    The host instantiates it once with ``role=KVConnectorRole.SCHEDULER`` in the engine process
    and once with ``role=KVConnectorRole.WORKER`` in every worker.
    """
