"""KV connector base class: moving KV cache between engine instances (prefill/decode split).

The same class is instantiated twice: once with ``role=SCHEDULER`` in the engine process and once
with ``role=WORKER`` in every worker. The scheduler half decides what to load or save each step
and packs it into :class:`KVConnectorMetadata`; the worker half moves the bytes layer by layer.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0  # in the engine-core process
    WORKER = 1  # in each worker process


class KVConnectorMetadata:
    """Opaque per-step plan, built by the scheduler role and shipped to the worker role."""


@dataclass
class KVConnectorTransferResults:
    """What finished since the last step. A failed receive is also listed as finished, so the
    request never hangs waiting for KV; the failure is reported separately for recompute."""

    finished_sending: set[str] = field(default_factory=set)
    finished_recving: set[str] = field(default_factory=set)
    failed_recving: set[str] = field(default_factory=set)


class KVConnector:
    """Base class for KV transfer. Methods are grouped by the role that calls them."""

    name: ClassVar[str] = ""

    def __init__(self, config: Any, role: KVConnectorRole) -> None:
        self.config = config
        self.role = role

    # -- scheduler role ----------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        """How many tokens beyond ``num_computed_tokens`` the external cache can supply.

        Returns ``(num_tokens, load_async)``; ``num_tokens=None`` means "not known yet, ask
        again next step". Count only the longest prefix that is actually retrievable.
        """
        return 0, False

    def update_state_after_alloc(self, request: Any, block_ids: list[int], num_external_tokens: int) -> None:
        """Called after blocks were allocated; load only when ``num_external_tokens > 0``."""

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        """Pack this step's load/save plan for the workers."""
        return KVConnectorMetadata()

    def request_finished(self, request: Any, block_ids: list[int]) -> bool:
        """Return True to take over freeing ``block_ids`` asynchronously (until finished_sending)."""
        return False

    # -- worker role -------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        """Receive the worker's KV cache tensors, keyed by layer name."""

    def bind_connector_metadata(self, metadata: KVConnectorMetadata) -> None:
        self._metadata = metadata

    def start_load_kv(self, forward_context: Any) -> None:
        """Begin loading external KV for this step (may be asynchronous)."""

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Block until ``layer_name``'s KV has arrived."""

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any) -> None:
        """Start saving one layer's KV after its forward pass."""

    def wait_for_save(self) -> None:
        """Block until every save started this step is done."""

    def get_transfer_results(self) -> KVConnectorTransferResults:
        return KVConnectorTransferResults()

    def get_block_ids_with_load_errors(self) -> set[int]:
        return set()
