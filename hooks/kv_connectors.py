"""Hooks of the ``host.kv_connectors`` family: moving KV cache between instances.

Loaded in the engine process (the connector's scheduler role) and in worker processes (its worker
role).
"""

from __future__ import annotations

from typing import Callable

from host.hooks.markers import hookspec


@hookspec
def host_register_kv_connectors(register: Callable[..., None]) -> None:
    """Offer :class:`host.sdk.KVConnector` subclasses.

    Call ``register(connector_class)``; ``--kv-connector NAME`` selects one by its ``name``.
    The host instantiates it once with ``role=KVConnectorRole.SCHEDULER`` in the engine process
    and once with ``role=KVConnectorRole.WORKER`` in every worker.
    """
