"""Built-in KV connectors (entry point ``host.kv_connectors: builtin_kv_connectors``), loaded in the
engine process (the scheduler role) and the workers (the worker role):

- ``shared_storage``: KV blocks saved by chained block hash to a directory any instance can read
  (a prefix cache that outlives a restart and is shared between instances);
- ``p2p``: a consumer pulls a producer's KV blocks over TCP (the prefill/decode split), with
  leases, heartbeats and a compatibility handshake.

See ``docs/kv_transfer.md``.
"""

from __future__ import annotations

from typing import Callable

from host.sdk import hookimpl


@hookimpl
def host_register_kv_connectors(register: Callable[..., None]) -> None:
    from .p2p import P2PConnector
    from .shared_storage import SharedStorageConnector

    register(P2PConnector)
    register(SharedStorageConnector)
