"""Decode graphs: whole decode forwards recorded once per batch size and replayed.

A decode step launches a few hundred small kernels; on a GPU their launch cost, not the work,
sets the step time for small models. A device graph (CUDA graph, HIP graph) records the launches
once and replays them with one call. Replays see no Python, so everything a step changes lives in
*persistent input buffers* whose addresses never change: token ids, positions, slot mapping,
sequence lengths, block table. A step of ``n`` decodes copies its inputs into the first ``n``
rows and replays the graph of the smallest captured size ``B >= n`` (*padded dispatch*); rows
``n..B-1`` are dummies that write no KV (slot ``-1``) and attend one position, and their outputs
are dropped.

Graphs are captured for a ladder of sizes (``CompilationConfig.cuda_graph_sizes``), largest
first, all sharing one memory pool. The attention metadata is built once per size over the
persistent buffers with ``max_seq_len`` set to ``max_model_len``, so any launch parameter a
backend derives from it (such as the number of split-K spans) holds for every later replay.
Only backends that declare ``supports_cuda_graphs`` take part: their metadata builder must keep
views of the buffers it is given and derive nothing from host-side values.
"""

from __future__ import annotations

import bisect
import logging
import time
from typing import Any, Callable

import numpy as np
import torch

from host.contracts.forward_context import ForwardContext, set_forward_context
from host.interfaces.attention import CommonAttentionMetadata

logger = logging.getLogger("host.graphs")


class DecodeGraphs:
    """The captured graphs of one model runner and the buffers they read."""

    def __init__(self, runner: Any, sizes: list[int]) -> None:
        if not sizes:
            raise ValueError("decode graphs need at least one batch size")
        self.runner = runner
        self.sizes = sorted(set(sizes))
        self.max_size = self.sizes[-1]
        dev = runner.device
        b = self.max_size
        max_blocks = runner.input_batch.block_table.shape[1]
        self.input_ids = torch.zeros(b, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(b, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((b,), -1, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(b, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(b + 1, dtype=torch.int32, device=dev)
        self.block_table = torch.zeros(b, max_blocks, dtype=torch.int32, device=dev)
        self._graphs: dict[int, tuple[Callable[[], Any], torch.Tensor]] = {}
        self.replays: dict[int, int] = {}  # batch size -> replays (for stats and tests)

    @property
    def num_replays(self) -> int:
        return sum(self.replays.values())

    def size_for(self, num_reqs: int) -> int | None:
        """The smallest captured batch size that holds ``num_reqs`` decodes (None: too many)."""
        i = bisect.bisect_left(self.sizes, num_reqs)
        return self.sizes[i] if i < len(self.sizes) else None

    def capture(self) -> None:
        """Warm up and capture a graph per size, largest first (the pool then only grows once)."""
        runner = self.runner
        platform = runner.platform
        builder = runner.attn_backend.get_builder_cls()(runner.attn_backend, runner.device)
        pool = platform.graph_pool()
        max_len = runner.config.scheduler.max_model_len
        t0 = time.perf_counter()
        for b in reversed(self.sizes):
            common = CommonAttentionMetadata(
                query_start_loc=self.query_start_loc[: b + 1],
                seq_lens=self.seq_lens[:b],
                block_table=self.block_table[:b],
                slot_mapping=self.slot_mapping[:b],
                num_reqs=b,
                num_actual_tokens=b,
                max_query_len=1,
                max_seq_len=max_len,  # an upper bound: launch parameters hold for any replay
                block_size=runner.block_size,
            )
            attn_metadata = builder.build(common)
            extra = {"attention_layers": runner.attention_layers}

            def forward(b: int = b, md: Any = attn_metadata) -> torch.Tensor:
                with set_forward_context(ForwardContext(md, runner.kv_caches, extra)):
                    return runner.model_forward(self.input_ids[:b], self.positions[:b])

            forward()  # warm-up: kernel compilation and autotuning happen outside the capture
            forward()
            self._graphs[b] = platform.capture_graph(forward, pool)
        logger.info(
            "Captured %d decode graphs (batch sizes %s) in %.1f s",
            len(self.sizes), _ranges(self.sizes), time.perf_counter() - t0,
        )

    def run(
        self,
        input_ids: np.ndarray,
        positions: np.ndarray,
        slot_mapping: np.ndarray,
        seq_lens: np.ndarray,
        block_table: np.ndarray,
        fill: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Replay the graph for ``len(input_ids)`` decodes (one token per request) and return
        their hidden states ``[n, hidden]``. The arrays are host-side; they are copied into the
        persistent buffers (through pinned memory on an accelerator); ``fill`` = (indices, ids)
        then overwrites token ids still in flight from the previous step, on the device."""
        n = len(input_ids)
        b = self.size_for(n)
        assert b is not None, f"{n} decodes exceed the largest graph ({self.max_size})"
        stage = self.runner.staging
        stage.copy_into(self.input_ids[:n], "ids", input_ids)
        stage.copy_into(self.positions[:n], "pos", positions)
        stage.copy_into(self.slot_mapping[:n], "slots", slot_mapping)
        stage.copy_into(self.seq_lens[:n], "seq", seq_lens.astype(np.int32, copy=False))
        nb = block_table.shape[1]
        stage.copy_into(self.block_table[:n, :nb], "blocks", block_table)
        if fill is not None:
            self.input_ids[fill[0]] = fill[1]
        if b > n:  # padding rows: no KV write, one position attended, output dropped
            self.input_ids[n:b].zero_()
            self.positions[n:b].zero_()
            self.slot_mapping[n:b].fill_(-1)
            self.seq_lens[n:b].fill_(1)
        replay, hidden = self._graphs[b]
        replay()
        self.replays[b] = self.replays.get(b, 0) + 1
        return hidden[:n]


def eager_replay_capture(fn: Callable[[], torch.Tensor], pool: Any = None) -> tuple[Callable[[], Any], torch.Tensor]:
    """A "graph" that replays by calling ``fn`` again and copying into the first output: the
    semantics of a device graph (same buffers in, same output tensor out) without a device that
    records. Tests use it to check padded dispatch and persistent buffers on CPU."""
    output = fn()
    return (lambda: output.copy_(fn())), output


def _ranges(sizes: list[int]) -> str:
    return f"{sizes[0]}..{sizes[-1]}" if len(sizes) > 3 else ", ".join(map(str, sizes))
