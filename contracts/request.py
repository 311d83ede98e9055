"""A request as the engine core tracks it: tokens, progress, status and block hashes.

``num_computed_tokens`` chasing ``num_tokens`` is the only notion of progress the scheduler has:
there is no separate prefill or decode phase (a decode is a request one token behind).
"""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, NewType

from host.contracts.sampling_params import SamplingParams

if TYPE_CHECKING:
    from host.contracts.lora_request import LoRARequest
    from host.contracts.messages import EngineCoreRequest

BlockHash = NewType("BlockHash", bytes)
"""The chained hash of one full KV block (computed by :mod:`host.core.kv_cache.hashing`)."""

BlockHasher = Callable[["Request"], list[BlockHash]]
"""Computes a request's block hashes not yet in ``request.block_hashes`` (set by the scheduler)."""


class RequestStatus(enum.IntEnum):
    """Lifecycle of a request; every status after ``PREEMPTED`` is final."""

    WAITING = enum.auto()
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = enum.auto()  # queued, its grammar still compiling
    WAITING_FOR_REMOTE_KVS = enum.auto()  # holds blocks a KV connector is filling (load_async)
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    # finished states: keep them last (is_finished compares against PREEMPTED)
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.PREEMPTED

    @property
    def finish_reason(self) -> str | None:
        """The OpenAI finish reason of a finished status ("stop", "length", "abort"), else None."""
        return _FINISH_REASONS.get(self)

    @staticmethod
    def get_finished_reason(status: "RequestStatus") -> str | None:
        return _FINISH_REASONS.get(status)


_FINISH_REASONS: dict[RequestStatus, str] = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


class Request:
    """One generation request inside the engine core.

    Holds the dual token lists (``output_token_ids`` and ``all_token_ids`` = prompt + output),
    the progress counter ``num_computed_tokens`` (tokens whose KV is in the cache), and the
    chained ``block_hashes`` of its full blocks, extended as tokens are appended once a block
    hasher is set (the scheduler sets one when prefix caching is on).

    ``num_cached_tokens`` is the prefix-cache hit at the first schedule (-1 before that).
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams | None = None,
        eos_token_id: int | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        block_hasher: "BlockHasher | None" = None,
        kv_transfer_params: dict[str, Any] | None = None,
        lora_request: "LoRARequest | None" = None,
        pooling_params: Any = None,
    ) -> None:
        self.request_id = request_id
        self.sampling_params = sampling_params if sampling_params is not None else SamplingParams()
        self.eos_token_id = eos_token_id
        self.arrival_time = time.time() if arrival_time is None else arrival_time
        self.priority = priority
        self.cache_salt = cache_salt
        # the client's KV transfer parameters (read by the KV connector), see EngineCoreRequest
        self.kv_transfer_params = kv_transfer_params
        # the LoRA adapter it runs with (None: the base model); keys its blocks' hashes and its slot
        self.lora_request = lora_request
        # a pooling request (PoolingParams): its whole prompt runs in one step, then it finishes
        self.pooling_params = pooling_params
        # a KV connector's load for this request failed: recompute, never ask it again
        self.kv_load_failed = False

        self.prompt_token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(self.prompt_token_ids)

        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        # tokens being sampled by steps already launched but not yet returned (asynchronous
        # scheduling): the next step computes them as inputs before their ids reach the host
        self.num_output_placeholders = 0
        self.num_cached_tokens = -1
        self.num_preemptions = 0
        self.stop_reason: int | str | None = None
        # set by the engine core for a request with structured_outputs (see structured_output.py)
        self.structured_output: Any = None
        # --speculative-config: drafts for the next step (from the last step's ModelRunnerOutput)
        self.spec_token_ids: list[int] = []

        self.block_hashes: list[BlockHash] = []
        self._block_hasher: BlockHasher | None = None
        self._hash_block_size = 1
        self._next_hash_at = 0
        if block_hasher is not None:
            self.set_block_hasher(block_hasher)

    # -- tokens ---------------------------------------------------------------------------

    @classmethod
    def from_engine_core_request(cls, msg: "EngineCoreRequest") -> "Request":
        """The engine core's state for one request message from the front end."""
        return cls(
            msg.request_id, msg.prompt_token_ids, msg.sampling_params, eos_token_id=msg.eos_token_id,
            arrival_time=msg.arrival_time or None, priority=msg.priority, cache_salt=msg.cache_salt,
            kv_transfer_params=msg.kv_transfer_params, lora_request=msg.lora_request,
            pooling_params=msg.pooling_params,
        )

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_tokens_planned(self) -> int:
        """Tokens the request will have once every launched step has returned."""
        return len(self.all_token_ids) + self.num_output_placeholders

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def max_tokens(self) -> int | None:
        return self.sampling_params.max_tokens

    def append_output_token_ids(self, token_ids: int | Iterable[int]) -> None:
        """Append sampled token(s) and hash any block they complete."""
        if isinstance(token_ids, int):
            self.output_token_ids.append(token_ids)
            self.all_token_ids.append(token_ids)
        else:
            token_ids = list(token_ids)
            self.output_token_ids.extend(token_ids)
            self.all_token_ids.extend(token_ids)
        # only call the hasher when a block has been completed
        if self._block_hasher is not None and len(self.all_token_ids) >= self._next_hash_at:
            self._extend_block_hashes()

    # -- hashing --------------------------------------------------------------------------
    @property
    def block_hasher(self) -> "BlockHasher | None":
        return self._block_hasher

    def set_block_hasher(self, block_hasher: "BlockHasher") -> None:
        """Set the incremental hasher and hash every full block present now."""
        self._block_hasher = block_hasher
        self._hash_block_size = getattr(block_hasher, "block_size", 1)
        self.block_hashes = []
        self._extend_block_hashes()

    def _extend_block_hashes(self) -> None:
        assert self._block_hasher is not None
        self.block_hashes.extend(self._block_hasher(self))
        self._next_hash_at = (len(self.block_hashes) + 1) * self._hash_block_size

    # -- status ---------------------------------------------------------------------------
    def is_finished(self) -> bool:
        return self.status.is_finished

    def get_finished_reason(self) -> str | None:
        return self.status.finish_reason

    def sort_key(self) -> tuple[int, float]:
        """Priority-policy order: lower ``priority`` first, then earlier arrival."""
        return (self.priority, self.arrival_time)

    def __repr__(self) -> str:
        return (
            f"Request(id={self.request_id!r}, status={self.status.name}, "
            f"computed={self.num_computed_tokens}/{self.num_tokens}, "
            f"prompt={self.num_prompt_tokens}, output={self.num_output_tokens})"
        )
