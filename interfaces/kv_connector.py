"""KV connector base class: moving KV cache between engine instances (prefill/decode split, a KV
store shared by instances).

The same class is instantiated twice: once with ``role=SCHEDULER`` in the engine process and once
with ``role=WORKER`` in every worker. The scheduler half decides what to load or save each step
and packs it into a :class:`KVConnectorMetadata`; the worker half moves the bytes.

The step, as the host drives it (``docs/kv_transfer.md`` has the picture):

Engine process (scheduler role), for a waiting request:

1. ``get_num_new_matched_tokens(request, num_computed_tokens)`` after the local prefix-cache
   lookup: ``(n, load_async)``. ``n`` extra prompt tokens (from ``num_computed_tokens``) are in
   the external cache; ``None`` means "not known yet", and the request stays queued (the batch
   goes on without it) and is asked again next step. The host caps the total at the prompt
   length, and always recomputes the prompt's last token to get its logits.
2. The host allocates blocks for the local hit plus the ``n`` external tokens (plus, for a
   synchronous load, the tokens computed this step), then calls
   ``update_state_after_alloc(request, block_ids, n)``: ``block_ids`` are all the request's
   blocks, in order; the external tokens start at the ``num_computed_tokens`` that step 1 was
   given (a block boundary: the local hit). Decide to load from ``n > 0``, not from ``block_ids``.
   - ``load_async=False``: the load runs in the workers during this very step, before the
     layers read the cache (``start_load_kv``/``wait_for_layer_load``), and the step computes
     the rest of the prompt.
   - ``load_async=True``: the request waits in ``WAITING_FOR_REMOTE_KVS`` (holding its blocks,
     not in the batch) until a worker reports it in ``finished_recving``.
3. ``build_connector_meta(scheduler_output)`` once per step, after every request is placed:
   the step's plan for the workers (it travels with the step; it must pickle).
4. ``request_finished(request, block_ids)`` when a request ends (any reason, aborts too):
   ``(delay_free, kv_transfer_params)``. ``delay_free=True`` takes over the blocks: the host
   frees them only once a worker reports the request in ``finished_sending``.
   ``kv_transfer_params`` go back to the client with the request's last output (a PD proxy
   passes them to the decode instance). ``block_ids`` is empty for a request that holds no
   computed KV (aborted while queued, preempted before it could hand off): never hand those off.
5. ``update_connector_output(output)`` with every step's aggregated worker report, before the
   host acts on it.

Worker processes (worker role), each holding its own shard of the KV cache under ``-tp``:

- ``register_kv_caches(kv_caches)`` once, after the cache is allocated: layer name
  (``"layers.<i>"``) -> that layer's tensor, shape ``(2, num_blocks, block_size, num_kv_heads,
  head_size)`` (K then V; this rank's heads only). Block ``b`` of a layer is ``kv[:, b]``.
- per step: ``bind_connector_metadata(meta)``, ``start_load_kv(forward_context)`` before the
  forward, ``wait_for_layer_load(name)`` before a layer reads its cache, ``save_kv_layer(name,
  kv_layer, attn_metadata)`` after it wrote this step's KV, ``wait_for_save()`` after the
  forward, then ``get_transfer_results()`` and ``get_block_ids_with_load_errors()``, then
  ``clear_connector_metadata()``. A step with no forward (nothing scheduled) still calls the
  last three, so asynchronous transfers are reported while the engine is otherwise idle.
- ``shutdown()`` when the worker stops.

Failure contract: a failed receive is reported in ``finished_recving`` *and* ``failed_recving``
(so the request never hangs), and its blocks in ``get_block_ids_with_load_errors``; the host
then recomputes from the first bad block (``kv_load_failure_policy="recompute"``) or fails the
request (``"fail"``). Bad blocks are never left in the prefix cache.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0  # in the engine-core process
    WORKER = 1  # in each worker process


class KVConnectorMetadata:
    """Opaque per-step plan, built by the scheduler role and shipped to the worker role (it must
    pickle: it rides the step broadcast to worker processes)."""


@dataclass
class KVConnectorTransferResults:
    """What finished since the last report. A failed receive is also listed as finished, so the
    request never hangs waiting for KV; the failure is reported separately for recompute."""

    finished_sending: set[str] = field(default_factory=set)
    finished_recving: set[str] = field(default_factory=set)
    failed_recving: set[str] = field(default_factory=set)


@dataclass
class KVConnectorOutput:
    """One step's worker report, as the scheduler sees it (aggregated over ranks).

    ``stats`` are counters since the last report (``load_bytes``, ``save_bytes``,
    ``external_hit_tokens``, ``failed_transfers``, or a connector's own names): summed over ranks
    and added to ``/metrics``."""

    finished_sending: set[str] = field(default_factory=set)
    finished_recving: set[str] = field(default_factory=set)
    failed_recving: set[str] = field(default_factory=set)
    invalid_block_ids: set[int] = field(default_factory=set)
    stats: dict[str, int] = field(default_factory=dict)


class KVOutputAggregator:
    """Combines the per-rank :class:`KVConnectorOutput` reports of ``world_size`` ranks (``None``
    for a rank with nothing): a request has finished sending or receiving only once every rank
    moved its shard, and has failed once any rank failed it; bad blocks and stats are unions and
    sums. Ranks report at different steps, so the counts carry over: one aggregator serves the
    engine's life."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._sending: dict[str, int] = {}
        self._recving: dict[str, int] = {}
        self._failed: set[str] = set()

    def add(self, outputs: Iterable[KVConnectorOutput | None]) -> KVConnectorOutput:
        out = KVConnectorOutput()
        for o in outputs:
            if o is None:
                continue
            out.invalid_block_ids |= o.invalid_block_ids
            for k, v in o.stats.items():
                out.stats[k] = out.stats.get(k, 0) + v
            self._failed |= o.failed_recving
            for ids, counts, done in ((o.finished_sending, self._sending, out.finished_sending),
                                      (o.finished_recving, self._recving, out.finished_recving)):
                for req_id in ids:
                    counts[req_id] = counts.get(req_id, 0) + 1
                    if counts[req_id] >= self.world_size:
                        del counts[req_id]
                        done.add(req_id)
        out.failed_recving = out.finished_recving & self._failed
        self._failed -= out.finished_recving
        return out


class KVConnector:
    """Base class for KV transfer. Methods are grouped by the role that calls them; each role
    gets the whole :class:`~host.core.config.EngineConfig` as ``config`` (its
    ``kv_transfer`` is the :class:`~host.core.config.KVTransferConfig`: role, extra config,
    ``engine_id``).

    Register a subclass through the ``host.kv_connectors`` entry-point group
    (``host_register_kv_connectors``); ``--kv-transfer-config '{"kv_connector": NAME, ...}'``
    selects it by ``name``.
    """

    name: ClassVar[str] = ""

    def __init__(self, config: Any, role: KVConnectorRole) -> None:
        self.config = config
        self.role = role
        self._metadata: KVConnectorMetadata | None = None

    # -- scheduler role ----------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        """How many tokens beyond ``num_computed_tokens`` the external cache can supply.

        Returns ``(num_tokens, load_async)``; ``num_tokens=None`` means "not known yet, ask
        again next step". Count only the longest prefix that is actually retrievable.

        ``request`` is the engine's request: read ``request_id``, ``prompt_token_ids``,
        ``all_token_ids``, ``num_tokens``, ``block_hashes`` (chained sha256 of each full block
        of ``block_size`` tokens, set whenever a connector is on), ``kv_transfer_params`` (the
        client's dict, or None) and ``sampling_params``; change nothing.
        """
        return 0, False

    def update_state_after_alloc(self, request: Any, block_ids: list[int], num_external_tokens: int) -> None:
        """Called after blocks were allocated; load only when ``num_external_tokens > 0``."""

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        """Pack this step's load/save plan for the workers."""
        return KVConnectorMetadata()

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """``(delay_free, kv_transfer_params)``: ``delay_free=True`` takes over freeing
        ``block_ids`` (until a worker reports ``finished_sending``)."""
        return False, None

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        """The step's aggregated worker report, before the scheduler acts on it."""

    def get_stats(self) -> dict[str, int]:
        """Scheduler-side counters since the last call (e.g. ``external_hit_tokens``), added to
        the workers' ``stats`` on ``/metrics``."""
        return {}

    # -- worker role -------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        """Receive the worker's KV cache tensors, keyed by layer name (``"layers.<i>"``)."""

    def bind_connector_metadata(self, metadata: KVConnectorMetadata) -> None:
        self._metadata = metadata

    def clear_connector_metadata(self) -> None:
        self._metadata = None

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

    def get_worker_stats(self) -> dict[str, int]:
        """Worker-side counters since the last call (``load_bytes``, ``save_bytes``,
        ``failed_transfers``)."""
        return {}

    def shutdown(self) -> None:
        """Stop background threads and sockets (both roles)."""
