"""Build the configured KV connector for one role (engine process: scheduler; worker: worker).

The connector class comes from the ``host.kv_connectors`` registry of the calling process (each
process loads its own plugin groups), so a name that is not installed fails where it is used,
naming what is."""

from __future__ import annotations

from typing import Any

from host.interfaces.kv_connector import KVConnector, KVConnectorRole


def layer_name(layer_idx: int) -> str:
    """The name a worker registers layer ``layer_idx``'s KV tensor under (and passes to
    ``wait_for_layer_load`` / ``save_kv_layer``)."""
    return f"layers.{layer_idx}"


def make_kv_connector(config: Any, role: KVConnectorRole) -> KVConnector | None:
    """The connector ``config.kv_transfer`` names, for ``role``; None without a KV transfer config."""
    kv_transfer = getattr(config, "kv_transfer", None)
    if kv_transfer is None:
        return None
    from host.core.plugins.manager import get_plugin_host

    connectors = get_plugin_host().registry("kv_connectors")
    cls = connectors.get(kv_transfer.kv_connector)
    if cls is None:
        raise ValueError(
            f"kv_transfer_config kv_connector={kv_transfer.kv_connector!r} is not registered; registered "
            f"KV connectors: {', '.join(sorted(connectors)) or 'none'} (a third-party one needs its package "
            "installed, and its plugin allowed by --plugins)"
        )
    return cls(config, role)
