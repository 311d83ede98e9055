"""``draft_model``: a smaller model of the same vocabulary drafts the next ``k`` tokens greedily.

The draft keeps its own paged KV cache: one layer spec per draft layer, appended after the
target's (:meth:`DraftModelProposer.kv_cache_specs`), on the same block ids. Block ``b`` of a
request holds the target's page and the draft's page for the same tokens, so the draft shares
the scheduler's block budget and a prefix-cache hit serves both.

After each step (:meth:`DraftModelProposer.propose`):

1. **Catch up.** One draft forward over every request of the step: for a request that emitted
   tokens, its positions from the step's first input to its last known token (the accepted
   inputs and the token just emitted; the rejected drafts' positions are left for the next step
   to overwrite); for a prefill chunk short of its prompt's end, the chunk. Same positions and
   block ids as the target, so the draft's KV stays in step with the target's.
2. **Draft.** The argmax at each request's last known token is its first draft; then ``k - 1``
   one-token forwards over the drafting requests, each feeding the previous draft at the next
   position.

The draft writes KV up to ``k - 1`` positions past the request's last token, and only into
blocks the request owns: the scheduler allocates ``SpeculativeConfig.kv_lookahead`` slots past
each step's tokens when blocks are free, and a request whose blocks still end earlier gets
fewer drafts. Positions past the known tokens hold
scratch KV that the next step's catch-up overwrites.

:class:`DraftModelProposer` is also the base of the EAGLE proposer (:mod:`.eagle`), which shifts
the inputs by one token and feeds the target's hidden states (``SHIFT`` and :meth:`_run`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np
import torch

from host.contracts.forward_context import ForwardContext, set_forward_context
from host.core.spec_decode.worker.proposer import DraftBatch, Proposer
from host.interfaces.attention import CommonAttentionMetadata

logger = logging.getLogger("host.spec_decode")


@dataclasses.dataclass
class _Pass:
    """One draft forward's flattened layout: request ``i`` (persistent-batch row ``rows[i]``)
    owns ``counts[i]`` consecutive positions ending at its ``last`` position."""

    rows: np.ndarray  # int64 [num_reqs]
    counts: np.ndarray  # int64 [num_reqs]
    positions: np.ndarray  # int64 [num_tokens]
    input_ids: np.ndarray  # int64 [num_tokens]


class DraftModelProposer(Proposer):
    """Drafts with a separate small model (``speculative_config.model``), loaded with the
    target's loader and dtype, run on the target's attention backend."""

    # how many tokens the drafter's input lags the sequence: 0 for a draft model (position q
    # takes token q), 1 for an EAGLE head (position q takes token q + 1 and the target's hidden
    # state at q)
    SHIFT = 0

    def __init__(self, config: Any, runner: Any) -> None:
        super().__init__(config, runner)
        self.model: torch.nn.Module | None = None
        self.hf_config: Any = None
        self.attn_backend: Any = None
        self.kv_caches: list[torch.Tensor] = []
        self._attention_layers: dict[int, Any] = {}
        self._builder: Any = None

    # -- start-up ----------------------------------------------------------------------------

    def load(self) -> None:
        from host.core.models.loader import load_model

        runner = self.runner
        draft_config = dataclasses.replace(
            self.config.model, model=self.spec.model, tokenizer=None, served_model_name=None,
            hf_config=None, architecture=None, resolved_path=None,
        )
        hf_config = _peek_config(self.spec.model)
        self._check_compatible(hf_config)
        backend = self._select_backend(hf_config)
        self.model, self.hf_config = load_model(draft_config, self.config.load, backend, device=runner.device)
        self.model.eval()
        runner.platform.prepare_model(self.model, self.config)
        self._attach(backend)
        logger.info(
            "draft model %s (%s, %d layers) drafts %d tokens per step",
            self.spec.model, draft_config.architecture, self.num_layers, self.k,
        )

    def _select_backend(self, hf_config: Any) -> Any:
        """The target's attention backend (the draft's KV tensors are allocated in its layout),
        when it can run the draft's shapes."""
        from host.core.worker.attention_selector import attention_requirements

        runner = self.runner
        backend = runner.attn_backend
        reason = backend.supports_combination(attention_requirements(self.config, runner.platform, hf_config, runner.dtype))
        if reason:
            raise ValueError(
                f"speculative_config model {self.spec.model!r} cannot run on the target's attention backend "
                f"{backend.name!r}: {reason}; use a draft whose head size the backend supports"
            )
        return backend

    def _attach(self, backend: Any) -> None:
        from host.core.models.attention_layer import Attention

        self.attn_backend = backend
        self._attention_layers = {m.layer_idx: m for m in self.model.modules() if isinstance(m, Attention)}
        # the draft's own builder: its scratch buffers are not the target's
        self._builder = backend.get_builder_cls()(backend, self.runner.device)

    def _check_compatible(self, hf_config: Any) -> None:
        """One rank, the same vocabulary as the target, positions enough for ``max_model_len``."""
        parallel = getattr(self.config, "parallel", None)
        if parallel is not None and parallel.world_size > 1:
            raise ValueError(
                f"speculative_config method {self.spec.method!r} runs on one rank only (the draft is not "
                f"sharded), not with -tp {parallel.tensor_parallel_size}; use -tp 1 or method ngram"
            )
        target = self.config.model.hf_config
        if int(hf_config.vocab_size) != int(target.vocab_size):
            raise ValueError(
                f"speculative_config model {self.spec.model!r} has vocab_size={hf_config.vocab_size} but the "
                f"target model has vocab_size={target.vocab_size}; a draft model must share the target's "
                "tokenizer and vocabulary"
            )
        max_len = int(self.config.scheduler.max_model_len)
        positions = getattr(hf_config, "max_position_embeddings", None)
        if positions is not None and int(positions) < max_len:
            raise ValueError(
                f"speculative_config model {self.spec.model!r} has max_position_embeddings={positions}, fewer "
                f"than max_model_len={max_len}; lower --max-model-len to {positions} or use a draft with longer positions"
            )

    @property
    def num_layers(self) -> int:
        return len(self._attention_layers)

    @property
    def num_kv_heads(self) -> int:
        from host.core.worker.model_runner import kv_heads_on_rank

        return kv_heads_on_rank(self.model, self.hf_config)

    @property
    def head_size(self) -> int:
        from host.core.worker.model_runner import head_size_of

        return head_size_of(self.hf_config)

    def kv_cache_specs(self) -> list[Any]:
        """One full-attention spec per draft layer: the target's block size and KV dtype, the
        draft's heads."""
        from host.core.kv_cache.spec import FullAttentionSpec

        kv_dtype = str(self.runner.kv_cache_dtype).removeprefix("torch.")
        return [
            FullAttentionSpec(self.runner.block_size, self.num_kv_heads, self.head_size, kv_dtype)
            for _ in range(self.num_layers)
        ]

    def bind_kv_caches(self, caches: list[torch.Tensor]) -> None:
        if len(caches) != self.num_layers:
            raise ValueError(f"the draft has {self.num_layers} KV layers but {len(caches)} KV tensors were bound")
        self.kv_caches = list(caches)

    # -- one step ----------------------------------------------------------------------------

    @torch.inference_mode()
    def propose(self, batch: DraftBatch) -> list[list[int]]:
        if self.model is None or not self.kv_caches:
            raise RuntimeError("the draft proposer runs after load() and bind_kv_caches()")
        drafts: list[list[int]] = [[] for _ in batch.req_ids]
        if len(batch.inputs.req_ids) == 0:
            return drafts
        catch_up, last_index, budget, hidden_in = self._catch_up(batch)
        if len(catch_up.positions) == 0:
            return drafts
        out = self._run(catch_up, hidden_in)
        drafting = np.flatnonzero(budget > 0)  # batch requests that get drafts
        if len(drafting) == 0:
            return drafts
        device = out.device
        out = out[torch.from_numpy(last_index[drafting]).to(device)]
        tokens = self._greedy(out)
        rows = np.asarray(batch.inputs.rows, dtype=np.int64)[self._catch_up_slot(batch)[drafting]]
        next_pos = catch_up.positions[last_index[drafting]] + 1
        left = budget[drafting]
        live = np.arange(len(drafting))
        chosen = [(live, tokens)]  # (drafting indices, their t-th drafts), kept on the device
        for t in range(1, int(left.max())):
            keep = left[live] > t
            if not keep.all():
                sel = torch.from_numpy(np.flatnonzero(keep)).to(device)
                live, tokens, out = live[keep], tokens[sel], out[sel]
            step = _Pass(rows=rows[live], counts=np.ones(len(live), dtype=np.int64),
                         positions=next_pos[live] + (t - 1), input_ids=np.zeros(0, dtype=np.int64))
            out = self._run(step, out if self.SHIFT else None, device_ids=tokens)
            tokens = self._greedy(out)
            chosen.append((live, tokens))
        for live_t, tok in chosen:  # one host copy per draft position, after the last forward
            for n, v in zip(live_t.tolist(), tok.tolist()):
                drafts[int(drafting[n])].append(int(v))
        return drafts

    def _catch_up_slot(self, batch: DraftBatch) -> np.ndarray:
        """For each batch request, its index among the catch-up pass's requests (the step's
        requests, in the step's order)."""
        return np.asarray(batch.rows, dtype=np.int64) if len(batch.rows) else np.array(
            [batch.inputs.req_ids.index(r) for r in batch.req_ids], dtype=np.int64
        )

    def _catch_up(self, batch: DraftBatch) -> tuple[_Pass, np.ndarray, np.ndarray, torch.Tensor | None]:
        """The catch-up pass over every request of the step, each batch request's index of its
        last catch-up token, how many drafts it may have (``0``: none), and the target hidden
        states the pass takes (EAGLE)."""
        inputs = batch.inputs
        runner = self.runner
        persistent = runner.input_batch
        shift = self.SHIFT
        bs = runner.block_size
        max_len = int(self.config.scheduler.max_model_len)
        slot_of = self._catch_up_slot(batch)
        emitted = {int(s): j for j, s in enumerate(slot_of)}
        qsl = inputs.query_start_loc
        counts, positions, ids, hidden_rows = [], [], [], []
        budget = np.zeros(len(batch.req_ids), dtype=np.int64)
        for r in range(len(inputs.req_ids)):
            row = int(inputs.rows[r])
            start, n = int(qsl[r]), int(inputs.num_scheduled[r])
            p0 = int(inputs.positions[start])
            # the last position whose KV may be written: inside the request's blocks and max_model_len
            writable = min(int(persistent.num_blocks[row]) * bs, max_len) - 1
            j = emitted.get(r)
            if j is None:  # a prefill chunk short of its prompt's end (or a request drafting nothing)
                tokens = persistent.token_ids[row]
                end = min(p0 + n - 1, int(persistent.num_tokens[row]) - 1 - shift)
            else:
                tokens = np.asarray(batch.token_ids[j], dtype=np.int64)
                length = len(tokens)
                end = min(length - 1 - shift, writable)
                if end == length - 1 - shift:
                    # the i-th draft is read at position end + i - 1, whose KV the last forward writes
                    budget[j] = max(0, min(self.k, writable - end + 1))
            counts.append(max(0, end - p0 + 1))
            positions.append(np.arange(p0, end + 1, dtype=np.int64))
            ids.append(tokens[p0 + shift : end + 1 + shift])
            hidden_rows.append(np.arange(start, start + end - p0 + 1, dtype=np.int64))
        counts_a = np.array(counts, dtype=np.int64)
        ran = counts_a > 0  # a request with nothing to catch up on is left out of the pass
        catch_up = _Pass(
            rows=np.asarray(inputs.rows, dtype=np.int64)[ran], counts=counts_a[ran],
            positions=np.concatenate(positions), input_ids=np.concatenate(ids).astype(np.int64),
        )
        last = np.cumsum(counts_a) - 1  # a drafting request always ran: its index is valid
        last_index = last[slot_of] if len(slot_of) else np.zeros(0, dtype=np.int64)
        hidden_in = None
        if shift:
            flat = torch.from_numpy(np.concatenate(hidden_rows)).to(batch.hidden_states.device)
            hidden_in = batch.hidden_states[flat]
        return catch_up, last_index, budget, hidden_in

    def _greedy(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden).argmax(dim=-1)

    def _run(self, step: _Pass, hidden_in: torch.Tensor | None, device_ids: torch.Tensor | None = None) -> torch.Tensor:
        """One draft forward over ``step`` (its ``input_ids``, or ``device_ids`` already on the
        device): the final hidden states, [num_tokens, hidden]. ``hidden_in`` is for the EAGLE
        head; a draft model takes none."""
        ids = device_ids if device_ids is not None else torch.from_numpy(step.input_ids).to(self.runner.device)
        positions = torch.from_numpy(step.positions).to(self.runner.device)
        with set_forward_context(ForwardContext(self._metadata(step), self.kv_caches, {"attention_layers": self._attention_layers})):
            return self.model(ids, positions)

    def _metadata(self, step: _Pass) -> Any:
        """The attention metadata of ``step``, on the requests' own block tables."""
        persistent = self.runner.input_batch
        bs = self.runner.block_size
        num_reqs = len(step.counts)
        owner = np.repeat(step.rows, step.counts)
        blocks = persistent.block_table[owner, step.positions // bs].astype(np.int64)
        slot_mapping = blocks * bs + step.positions % bs
        cu = np.cumsum(step.counts)
        qsl = np.zeros(num_reqs + 1, dtype=np.int32)
        qsl[1:] = cu
        seq_lens = (step.positions[cu - 1] + 1).astype(np.int32)
        max_blocks = int(-(-int(seq_lens.max()) // bs))
        block_table = np.ascontiguousarray(persistent.block_table[step.rows, :max_blocks])
        device = self.runner.device
        common = CommonAttentionMetadata(
            query_start_loc=torch.from_numpy(qsl).to(device),
            seq_lens=torch.from_numpy(seq_lens).to(device),
            block_table=torch.from_numpy(block_table).to(device),
            slot_mapping=torch.from_numpy(slot_mapping).to(device),
            num_reqs=num_reqs,
            num_actual_tokens=len(step.positions),
            max_query_len=int(step.counts.max()),
            max_seq_len=int(seq_lens.max()),
            block_size=bs,
            query_start_loc_cpu=torch.from_numpy(qsl),
            seq_lens_cpu=torch.from_numpy(seq_lens),
        )
        return self._builder.build(common)


def _peek_config(path: str | None) -> Any:
    """The draft's ``transformers`` config (a ValueError naming the path when it is not a model)."""
    from host.core.models.default_model import resolve_model_path
    from host.core.models.loader import load_hf_config

    return load_hf_config(resolve_model_path(path))
