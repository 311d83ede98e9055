"""The model runner's speculative step (``--speculative-config``): run each request's scheduled
drafts through the target model with its last token, verify them with the rejection sampler,
record the emitted tokens, and ask the proposer for the next step's drafts.

The plain step stays as it is without speculation; with it, every step takes this path (the
proposer needs every step's tokens, also in steps that verified no drafts). The drafts of a
request (``SchedulerOutput.scheduled_spec_decode_tokens``) follow its last known token in the
step's inputs; logits are computed at each of those ``1 + d`` positions; the KV written for
rejected drafts is overwritten later, because the scheduler rolls ``num_computed_tokens`` back
by the rejected count.

A step kind (``"speculative"``, :mod:`host.core.worker.step_kind`), peer of the sampling and
the pooling steps: it composes the runner's public phases (``update_states``,
``prepare_inputs``, ``run_forward``, ``logits_at``, ``prompt_logprobs``) and records the emitted
tokens in the runner's persistent batch itself (several per request).
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from host.contracts.runner_output import ModelRunnerOutput, StepTiming
from host.core.spec_decode.worker.proposer import DraftBatch, make_proposer
from host.core.spec_decode.worker.rejection_sampler import RejectionSampler
from host.core.structured_output.worker import bitmask_to_bool

if TYPE_CHECKING:
    from host.contracts.scheduler_output import SchedulerOutput
    from host.core.worker.model_runner import ModelRunner

logger = logging.getLogger("host.spec_decode")


class SpecDecodeStep:
    """The proposer and the verification of one model runner (see the module docstring; the
    step kind ``"speculative"``)."""

    name = "speculative"
    computes_logits = True

    def __init__(self, runner: "ModelRunner") -> None:
        self.runner = runner
        self.k = int(runner.config.speculative.num_speculative_tokens)
        self.proposer = make_proposer(runner.config, runner)
        self.rejection_sampler = RejectionSampler(runner.sampler)
        # q of the drafts a proposer with a distribution sent for the next step, by request
        self._draft_probs: dict[str, torch.Tensor] = {}

    # -- start-up: the proposer's model and KV ---------------------------------------------------
    def load(self) -> None:
        self.rejection_sampler.sampler = self.runner.sampler
        self.proposer.load()

    def kv_cache_specs(self) -> list[Any]:
        return list(self.proposer.kv_cache_specs())

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """One tensor per proposer spec, in the attention backend's layout, on the same block ids."""
        runner = self.runner
        specs = self.kv_cache_specs()
        if not specs:
            return
        from host.core.kv_cache.spec import kv_cache_element_dtype
        from host.core.worker.kv_buffer import allocate_kv_buffer

        caches = []
        for spec in specs:
            shape = runner.attn_backend.get_kv_cache_shape(num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size)
            dtype = getattr(torch, kv_cache_element_dtype(runner.config.cache.cache_dtype, spec.dtype))
            caches.append(allocate_kv_buffer(math.prod(shape), dtype, torch.device(runner.device)).view(shape))
        self.proposer.bind_kv_caches(caches)

    # -- one step ---------------------------------------------------------------------------------
    def execute(self, so: "SchedulerOutput", non_blocking: bool = False) -> ModelRunnerOutput:
        """One verify step (always finished: ``non_blocking`` changes nothing)."""
        r = self.runner
        t_start = time.perf_counter()
        if not r.update_states(so):
            return ModelRunnerOutput(req_ids=[], req_id_to_index={}, sampled_token_ids=[], spec_token_ids=[])
        batch = r.input_batch
        scheduled_drafts = so.scheduled_spec_decode_tokens or {}
        # the drafts follow each request's known tokens: in its row, counted for the step only
        bumped: list[tuple[int, int]] = []
        for req_id, drafts in scheduled_drafts.items():
            index = batch.req_id_to_index[req_id]
            n = int(batch.num_tokens[index])
            batch.token_ids[index, n: n + len(drafts)] = drafts
            batch.num_tokens[index] = n + len(drafts)
            bumped.append((index, len(drafts)))
        try:
            inputs = r.prepare_inputs(so)
        finally:
            for index, d in bumped:
                batch.num_tokens[index] -= d
        req_ids, num_scheduled, rows = inputs.req_ids, inputs.num_scheduled, inputs.rows
        hidden = r.run_forward(inputs)
        drafts = [list(scheduled_drafts.get(req_id, ())) for req_id in req_ids]
        d = np.array([len(x) for x in drafts], dtype=np.int64)
        counts = d + 1
        cu = np.cumsum(num_scheduled)
        first = np.repeat(cu - counts, counts)
        within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        logits_rows = first + within
        logits = r.logits_at(hidden, inputs, logits_rows)
        states = [batch.states[i] for i in rows]
        computed_before = batch.num_computed_tokens[rows]
        final = (computed_before + num_scheduled >= batch.num_tokens[rows]).tolist()
        t_sample = time.perf_counter()
        allowed = self._grammar_masks(so, req_ids, logits.shape[-1])
        draft_probs = None
        if self._draft_probs:
            draft_probs = [self._draft_probs.get(req_id)[: len(x)] if req_id in self._draft_probs and x else None
                           for req_id, x in zip(req_ids, drafts)]
        result = self.rejection_sampler(logits, states, drafts, final, allowed=allowed, draft_probs=draft_probs)
        emitted = result.token_ids
        self._record(req_ids, emitted)
        prompt_logprobs = r.prompt_logprobs(hidden, states, computed_before, num_scheduled)
        t_sampled = time.perf_counter()
        spec_token_ids = self._propose(inputs, hidden, states, emitted, d, np.array(result.num_accepted))
        if r.step_timings is not None:
            r.step_timings.append(StepTiming(len(req_ids), int(num_scheduled.sum()), t_sampled - t_sample, time.perf_counter() - t_start))
        return ModelRunnerOutput(
            req_ids=list(req_ids),
            req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},
            sampled_token_ids=emitted,
            logprobs=result.logprobs if any(x is not None for x in result.logprobs) else None,
            prompt_logprobs=prompt_logprobs,
            spec_token_ids=spec_token_ids,
        )

    @staticmethod
    def _grammar_masks(so: "SchedulerOutput", req_ids: list[str], vocab: int) -> dict[int, torch.Tensor] | None:
        """The structured-output masks of each constrained request, bool ``[1 + d, V]``: the
        bitmask holds one row per position it verifies, request by request (see
        ``StructuredOutputManager.grammar_bitmask``)."""
        if so.grammar_bitmask is None:
            return None
        index = {req_id: i for i, req_id in enumerate(req_ids)}
        allowed = bitmask_to_bool(so.grammar_bitmask, vocab)
        drafts = so.scheduled_spec_decode_tokens or {}
        masks, row = {}, 0
        for req_id in so.structured_output_request_ids:
            n = 1 + len(drafts.get(req_id, ()))
            if req_id in index:
                masks[index[req_id]] = allowed[row: row + n]
            row += n
        return masks

    def _record(self, req_ids: list[str], emitted: list[list[int]]) -> None:
        """Append each request's emitted tokens to its persistent row and state."""
        batch = self.runner.input_batch
        for req_id, tokens in zip(req_ids, emitted):
            if not tokens:
                continue
            index = batch.req_id_to_index[req_id]
            n = int(batch.num_tokens[index])
            fit = tokens[: max(0, batch.max_model_len - n)]
            batch.token_ids[index, n: n + len(fit)] = fit
            batch.num_tokens[index] = n + len(tokens)
            batch.states[index].output_token_ids.extend(tokens)

    def _propose(self, inputs: Any, hidden: torch.Tensor, states: list[Any], emitted: list[list[int]],
                 num_drafted: np.ndarray, num_accepted: np.ndarray) -> list[list[int]]:
        """The next step's drafts per request of the step (``[]`` for one that emitted nothing
        or has no room left for drafts; the scheduler cuts a constrained request's drafts to
        what its grammar accepts)."""
        batch = self.runner.input_batch
        spec_token_ids: list[list[int]] = [[] for _ in emitted]
        which = []
        for i, (state, tokens) in enumerate(zip(states, emitted)):
            sp = state.sampling_params
            if not tokens:
                continue
            if sp.max_tokens is not None and len(state.output_token_ids) + 1 >= sp.max_tokens:
                continue  # at most one token left: nothing to draft for
            which.append(i)
        if not which and not self.kv_cache_specs():  # a proposer with KV catches up on every step
            self._draft_probs = {}
            return spec_token_ids
        rows = np.array(which, dtype=np.int64)
        token_ids = []
        for i in which:
            index = batch.req_id_to_index[inputs.req_ids[i]]
            token_ids.append(batch.token_ids[index, : int(batch.num_tokens[index])])
        draft_batch = DraftBatch(
            req_ids=[inputs.req_ids[i] for i in which],
            token_ids=token_ids,
            num_accepted=np.array([len(emitted[i]) for i in which], dtype=np.int64),
            inputs=inputs,
            hidden_states=hidden,
            sampled_token_ids=[emitted[i] for i in which],
            k=self.k,
            rows=rows,
            num_rejected=(num_drafted - num_accepted)[rows],
        )
        proposals = self.proposer.propose(draft_batch)
        if len(proposals) != len(which):
            raise RuntimeError(f"proposer {type(self.proposer).__name__} returned {len(proposals)} draft lists for {len(which)} requests")
        for i, p in zip(which, proposals):
            spec_token_ids[i] = [int(t) for t in p[: self.k]]
        probs = getattr(self.proposer, "draft_probs", None)
        self._draft_probs = dict(probs) if probs else {}
        return spec_token_ids
