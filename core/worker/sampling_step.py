"""The plain sampling step: the model runner's phases composed into one step that samples one
token per request whose scheduled tokens reach its end.

``update_states`` -> ``prepare_inputs`` -> ``run_forward`` (a stage before the last sends its
hidden states on and stops there) -> ``logits_at`` the last token of each request -> the sampler
(with each request's seeded generator and the structured-output bitmask) ->
``keep_sampled_on_device`` (the next step may read them before the host does) -> the prompt
logprobs -> a :class:`~host.core.worker.step_handle.PendingStep`, whose ``get_output`` waits for
the sampled ids and hands them to the runner's ``record_sampled``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from host.contracts.runner_output import ModelRunnerOutput
from host.core.structured_output.worker import bitmask_to_bool
from host.core.worker.sampler import make_metadata, seeded_generator
from host.core.worker.step_handle import PendingStep

if TYPE_CHECKING:
    from host.contracts.scheduler_output import SchedulerOutput
    from host.core.worker.input_batch import CachedRequestState
    from host.core.worker.model_runner import ModelRunner


class SamplingStep:
    """The plain step of one model runner (the step kind ``"sampling"``)."""

    name = "sampling"
    computes_logits = True

    def __init__(self, runner: "ModelRunner") -> None:
        self.runner = runner

    def load(self) -> None:
        """Nothing beyond the target model."""

    def kv_cache_specs(self) -> list[Any]:
        return []

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """No KV layers of its own."""

    def execute(self, so: "SchedulerOutput", non_blocking: bool) -> "ModelRunnerOutput | PendingStep":
        """One step. With ``non_blocking`` the :class:`PendingStep` is returned as soon as the
        step is launched; otherwise its finished output."""
        runner = self.runner
        t_start = time.perf_counter()
        if not runner.update_states(so):
            return ModelRunnerOutput(req_ids=[], req_id_to_index={}, sampled_token_ids=[])
        batch = runner.input_batch
        inputs = runner.prepare_inputs(so)
        num_scheduled, req_ids = inputs.num_scheduled, inputs.req_ids
        hidden = runner.run_forward(inputs)
        if not runner.pipeline.is_last:
            runner.pipeline.send(hidden)  # the last stage samples
            return ModelRunnerOutput(req_ids=[], req_id_to_index={}, sampled_token_ids=[])
        # each request's last token (one token per request: every row, and logits_at scores hidden whole)
        logits = runner.logits_at(hidden, inputs, np.cumsum(num_scheduled) - 1)
        rows = inputs.rows
        states = [batch.states[i] for i in rows]
        computed_before = batch.num_computed_tokens[rows]
        computed_after = computed_before + num_scheduled
        # rows whose sample becomes a token (a prefill chunk short of the prompt's end does not;
        # the host's token count may lag by tokens still in flight, which only adds "final" rows)
        final = computed_after >= batch.num_tokens[rows]
        t_sample = time.perf_counter()
        md = make_metadata(states, logits.shape[-1], generators=self.generators(states, final))
        if so.grammar_bitmask is not None:
            self.apply_grammar(md, so, req_ids, logits.shape[-1])
        result = runner.sampler(logits, md)
        runner.keep_sampled_on_device(result.sampled_token_ids, req_ids)
        prompt_logprobs = runner.prompt_logprobs(hidden, states, computed_before, num_scheduled)
        step = PendingStep(runner, req_ids, final, [s.sampling_params.logprobs for s in states], result, prompt_logprobs,
                           (t_start, t_sample, int(num_scheduled.sum())))
        return step if non_blocking else step.get_output()

    @staticmethod
    def apply_grammar(md: Any, so: "SchedulerOutput", req_ids: list[str], vocab: int) -> None:
        """Fold the structured-output bitmask rows into the sampler's allowed-token mask."""
        index = {r: i for i, r in enumerate(req_ids)}
        rows = [index[r] for r in so.structured_output_request_ids]
        allowed = bitmask_to_bool(so.grammar_bitmask, vocab)
        mask = md.allowed_mask if md.allowed_mask is not None else torch.ones(len(req_ids), vocab, dtype=torch.bool)
        mask[rows] &= allowed
        md.allowed_mask = mask

    @staticmethod
    def generators(states: list["CachedRequestState"], final: np.ndarray) -> dict[int, torch.Generator]:
        """Generators for seeded rows that sample a real token this step, seeded from (seed,
        number of tokens generated so far): the draw for a request's n-th token is the same
        whatever the batch, the chunking or a preemption in between."""
        gens: dict[int, torch.Generator] = {}
        for i, state in enumerate(states):
            seed = state.sampling_params.seed
            if seed is not None and final[i] and not state.sampling_params.is_greedy:
                gens[i] = seeded_generator(hash((seed, len(state.output_token_ids))))
        return gens
