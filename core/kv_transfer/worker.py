"""The worker's side of a KV connector: its worker role called around each forward.

The model runner owns one :class:`WorkerKVConnector` when the engine has a
``--kv-transfer-config``. Per step: :meth:`before_forward` binds the scheduler's plan, starts the
loads and waits for every layer's (so the forward, whichever path runs it — layer by layer, the
fused decode kernel, a graph replay — reads complete pages); :meth:`after_forward` offers every
layer's pages to ``save_kv_layer`` and waits for the saves; :meth:`report` collects what
finished. Steps with no forward call :meth:`before_forward` and :meth:`report` too, so loads
the scheduler admitted start, and transfers finishing meanwhile are reported.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from host.core.kv_transfer.factory import layer_name, make_kv_connector
from host.interfaces.kv_connector import KVConnectorOutput, KVConnectorRole

logger = logging.getLogger("host.worker")


class WorkerKVConnector:
    """One worker's connector (worker role) over its KV cache tensors."""

    def __init__(self, config: Any, kv_caches: dict[int, torch.Tensor]) -> None:
        self.connector = make_kv_connector(config, KVConnectorRole.WORKER)
        self.layers = {layer_name(i): kv for i, kv in kv_caches.items()}
        self.connector.register_kv_caches(dict(self.layers))
        self._bound = False

    def before_forward(self, scheduler_output: Any, forward_context: Any = None) -> None:
        meta = getattr(scheduler_output, "kv_connector_metadata", None)
        if meta is None:
            self._bound = False
            return
        self.connector.bind_connector_metadata(meta)
        self._bound = True
        self.connector.start_load_kv(forward_context)
        for name in self.layers:
            self.connector.wait_for_layer_load(name)

    def after_forward(self, attn_metadata: Any) -> None:
        if not self._bound:
            return
        for name, kv in self.layers.items():
            self.connector.save_kv_layer(name, kv, attn_metadata)
        self.connector.wait_for_save()

    def report(self) -> KVConnectorOutput:
        """What finished since the last report; unbinds the step's plan."""
        results = self.connector.get_transfer_results()
        out = KVConnectorOutput(
            finished_sending=set(results.finished_sending),
            finished_recving=set(results.finished_recving) | set(results.failed_recving),
            failed_recving=set(results.failed_recving),
            invalid_block_ids=set(self.connector.get_block_ids_with_load_errors()),
            stats=dict(self.connector.get_worker_stats()),
        )
        if self._bound:
            self.connector.clear_connector_metadata()
            self._bound = False
        return out

    def shutdown(self) -> None:
        self.connector.shutdown()
