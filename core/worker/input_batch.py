"""The persistent batch: the running requests' rows, kept across steps, and one step's
flattened inputs built from them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from host.contracts.scheduler_output import NewRequestData


@dataclass
class CachedRequestState(NewRequestData):
    """What the runner remembers about one request between steps: the scheduler's description
    of it when it was new (its lists the runner's own copies), plus what the runner derives."""

    _allowed: torch.Tensor | None = field(default=None, repr=False)

    def allowed_mask(self, vocab: int) -> torch.Tensor:
        """bool [vocab]: the ``allowed_token_ids`` whitelist (built once per request)."""
        if self._allowed is None:
            mask = torch.zeros(vocab, dtype=torch.bool)
            mask[torch.tensor(self.sampling_params.allowed_token_ids, dtype=torch.int64)] = True
            self._allowed = mask
        return self._allowed


class InputBatch:
    """Fixed-capacity rows holding the persistent state of the running requests.

    Row ``i`` has the token ids of one request (prompt then outputs), how many of them are
    known, and its block table. Removing a request leaves a hole that :meth:`condense` fills by
    moving the last rows down, so rows ``0..num_reqs-1`` are always dense.

    With a hybrid KV cache (``num_groups > 1``) each row has one block table per KV cache group:
    ``block_table`` is group 0's, ``group_block_tables[g - 1]`` group ``g``'s. All of a request's
    tables have the same length (``num_blocks``): a sliding-window group's entries are positional
    too (its freed ones keep their old ids here; the window never reads them).
    """

    def __init__(self, max_num_reqs: int, max_model_len: int, max_blocks_per_req: int, num_groups: int = 1) -> None:
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        self.token_ids = np.zeros((max_num_reqs, max_model_len), dtype=np.int64)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_computed_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.block_table = np.zeros((max_num_reqs, max_blocks_per_req), dtype=np.int32)
        self.num_blocks = np.zeros(max_num_reqs, dtype=np.int64)
        self.group_block_tables = [
            np.zeros((max_num_reqs, max_blocks_per_req), dtype=np.int32) for _ in range(num_groups - 1)
        ]
        self.req_ids: list[str | None] = []
        self.req_id_to_index: dict[str, int] = {}
        self.states: list[CachedRequestState | None] = []

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_index)

    def add(self, state: CachedRequestState) -> None:
        try:
            index = self.req_ids.index(None)
        except ValueError:
            index = len(self.req_ids)
            if index >= self.max_num_reqs:
                raise RuntimeError(f"persistent batch is full ({self.max_num_reqs} requests)") from None
            self.req_ids.append(None)
            self.states.append(None)
        self.req_ids[index] = state.req_id
        self.states[index] = state
        self.req_id_to_index[state.req_id] = index
        ids = state.prompt_token_ids + state.output_token_ids
        self.token_ids[index, : len(ids)] = ids
        self.num_tokens[index] = len(ids)
        self.num_computed_tokens[index] = state.num_computed_tokens
        self.num_blocks[index] = 0
        self.append_blocks(index, state.block_ids, state.group_block_ids or None)

    def append_blocks(self, index: int, block_ids: list[int], group_block_ids: list[list[int]] | None = None) -> None:
        """Append group 0's ``block_ids`` (and, hybrid, groups 1..'s ``group_block_ids``: as many)
        to row ``index``'s tables."""
        start = int(self.num_blocks[index])
        end = start + len(block_ids)
        if end > self.block_table.shape[1]:
            raise RuntimeError(f"block table row overflow: {end} > {self.block_table.shape[1]} blocks")
        self.block_table[index, start:end] = block_ids
        if group_block_ids:
            for table, ids in zip(self.group_block_tables, group_block_ids):
                table[index, start:end] = ids
        self.num_blocks[index] = end

    def remove(self, req_id: str) -> None:
        index = self.req_id_to_index.pop(req_id, None)
        if index is None:
            return
        self.req_ids[index] = None
        self.states[index] = None

    def condense(self) -> None:
        """Move live rows from the tail into holes so live rows are ``0..num_reqs-1``."""
        n = self.num_reqs
        holes = [i for i in range(n) if self.req_ids[i] is None]
        movers = [i for i in range(n, len(self.req_ids)) if self.req_ids[i] is not None]
        for hole, src in zip(holes, movers):
            req_id = self.req_ids[src]
            k = int(self.num_tokens[src])
            self.token_ids[hole, :k] = self.token_ids[src, :k]
            self.num_tokens[hole] = k
            self.num_computed_tokens[hole] = self.num_computed_tokens[src]
            nb = int(self.num_blocks[src])
            self.block_table[hole, :nb] = self.block_table[src, :nb]
            for table in self.group_block_tables:
                table[hole, :nb] = table[src, :nb]
            self.num_blocks[hole] = nb
            self.req_ids[hole] = req_id
            self.states[hole] = self.states[src]
            self.req_id_to_index[req_id] = hole
        del self.req_ids[n:]
        del self.states[n:]


@dataclass
class StepInputs:
    """One step's flattened batch on the host: token ``t`` belongs to request
    ``req_indices[t]``; request ``i`` owns ``query_start_loc[i]:query_start_loc[i+1]``."""

    req_ids: list[str]
    rows: np.ndarray  # int64 [num_reqs]: each request's row in the persistent batch
    num_scheduled: np.ndarray  # int64 [num_reqs]
    input_ids: np.ndarray  # int64 [num_tokens]
    positions: np.ndarray  # int64 [num_tokens]
    slot_mapping: np.ndarray  # int64 [num_tokens]
    query_start_loc: np.ndarray  # int32 [num_reqs + 1]
    seq_lens: np.ndarray  # int32 [num_reqs]
    block_table: np.ndarray  # int32 [num_reqs, max_blocks] (a view of the persistent batch)
    # (flat token indices, rows of the previous step's sampled ids) for tokens still in flight
    placeholders: tuple[np.ndarray, np.ndarray] | None = None
    # a hybrid KV cache: (block_table, slot_mapping) of KV cache groups 1.. (the fields above
    # are group 0's); None with one group
    group_tables: list[tuple[np.ndarray, np.ndarray]] | None = None
