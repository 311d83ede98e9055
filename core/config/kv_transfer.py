"""``--kv-transfer-config``: the KV connector an engine runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from host.core.config.common import KV_LOAD_FAILURE_POLICIES, KV_ROLES, config_from_flag


@dataclass
class KVTransferConfig:
    """``--kv-transfer-config``: the KV connector this engine runs (vLLM's keys, see
    ``docs/kv_transfer.md``).

    ``kv_connector``: a name registered in ``host.kv_connectors`` (checked when the engine
    starts, against what is installed). ``kv_role``: ``kv_producer`` (computes prompts and hands
    their KV off), ``kv_consumer`` (loads KV others computed) or ``kv_both``.
    ``kv_connector_extra_config``: the connector's own settings. ``kv_load_failure_policy``: a
    failed load is recomputed (``recompute``, the default) or fails its request (``fail``).
    ``engine_id`` names this engine to its peers (a fresh uuid unless set); ``http_port`` is
    the server's port (``host serve`` sets it; a connector may derive its own ports from it).
    """

    kv_connector: str = ""
    kv_role: str = "kv_both"
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)
    kv_load_failure_policy: str = "recompute"
    engine_id: str = ""
    http_port: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kv_connector, str) or not self.kv_connector:
            raise ValueError(
                f"kv_transfer_config kv_connector={self.kv_connector!r} must name a KV connector, "
                'e.g. --kv-transfer-config \'{"kv_connector": "shared_storage", "kv_role": "kv_both"}\''
            )
        if self.kv_role not in KV_ROLES:
            raise ValueError(f"kv_transfer_config kv_role={self.kv_role!r} is not one of {', '.join(KV_ROLES)}")
        if self.kv_load_failure_policy not in KV_LOAD_FAILURE_POLICIES:
            raise ValueError(
                f"kv_transfer_config kv_load_failure_policy={self.kv_load_failure_policy!r} is not one of "
                f"{', '.join(KV_LOAD_FAILURE_POLICIES)}"
            )
        if not isinstance(self.kv_connector_extra_config, dict):
            raise ValueError(
                f"kv_transfer_config kv_connector_extra_config={self.kv_connector_extra_config!r} must be a JSON object"
            )
        if not self.engine_id:
            import uuid

            self.engine_id = uuid.uuid4().hex

    @classmethod
    def from_value(cls, value: "KVTransferConfig | dict[str, Any] | str | None") -> "KVTransferConfig | None":
        """A config from a dict, a JSON string (the flag), itself, or None (no connector).
        Unknown keys are a ValueError naming the known ones."""
        return config_from_flag(cls, value, "--kv-transfer-config", "kv_transfer_config")

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_kv_consumer(self) -> bool:
        return self.kv_role in ("kv_consumer", "kv_both")

    @property
    def extra(self) -> dict[str, Any]:
        return self.kv_connector_extra_config
