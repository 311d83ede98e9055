"""The pooling step of the model runner: one step's prompts -> one pooled vector each.

A step kind (``"pooling"``, :mod:`host.core.worker.step_kind`), peer of the sampling and the
speculative steps: it runs the runner's ``update_states``, ``prepare_inputs`` and
``run_forward`` phases, then pools instead of sampling.

Used when ``config.model.runner == "pooling"`` (an encoder such as ``BertModel``, or a decoder
with ``--convert embed``). The scheduler gives every pooling request its whole prompt in one
step (chunked prefill and prefix caching are off for pooling models), so each scheduled
request's tokens are its full prompt. The step reuses the runner's persistent batch, input
layout and forward (blocks allocated as for generation: a decoder writes its KV pages, an
encoder attends within the step without them); then the :class:`~host.core.pooling.pooler.Pooler`
reduces each prompt's last hidden states and nothing is sampled. The request finishes in this
step (:mod:`host.core.pooling.scheduler`) and its blocks are freed.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from host.contracts.runner_output import ModelRunnerOutput
from host.core.pooling.pooler import Pooler

if TYPE_CHECKING:
    from host.contracts.scheduler_output import SchedulerOutput
    from host.core.worker.model_runner import ModelRunner

logger = logging.getLogger("host.model_runner")


class PoolingRunner:
    """Runs pooling steps for a :class:`ModelRunner` (the step kind ``"pooling"``, built by the
    runner's ``load_model`` through the worker's ``make_step_kind``)."""

    name = "pooling"
    computes_logits = False  # one vector per prompt, no logits

    def __init__(self, runner: "ModelRunner") -> None:
        self.runner = runner
        self.pooler = Pooler(runner.config.model.pooler)
        compilation = runner.config.compilation
        # decode graphs and a fused whole-stack decode kernel serve one-token decode steps only
        compilation.cuda_graphs = False
        compilation.cuda_graph_sizes = []
        decoder = getattr(runner.model, "model", None)
        if getattr(decoder, "decode_kernel", None) is not None:
            decoder.decode_kernel = None
        logger.info("pooling runner: %s pooling, normalize=%s (from %s)", self.pooler.config.pooling_type,
                    self.pooler.config.normalize, self.pooler.config.source)

    def load(self) -> None:
        """Nothing beyond the target model."""

    def kv_cache_specs(self) -> list[Any]:
        return []

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """No KV layers of its own."""

    def execute(self, so: "SchedulerOutput", non_blocking: bool = False) -> ModelRunnerOutput:
        """One pooling step (always finished: ``non_blocking`` changes nothing)."""
        runner = self.runner
        if not runner.update_states(so):
            return ModelRunnerOutput(req_ids=[], req_id_to_index={}, sampled_token_ids=[], pooler_output={})
        batch = runner.input_batch
        inputs = runner.prepare_inputs(so)
        states = [batch.states[i] for i in inputs.rows]
        partial = [s.req_id for s, n, c in zip(states, inputs.num_scheduled, batch.num_computed_tokens[inputs.rows])
                   if c != 0 or n != len(s.prompt_token_ids)]
        if partial:
            raise RuntimeError(f"pooling requests {partial[:3]} were not scheduled whole prompts in one step (chunked prefill must be off)")
        hidden = runner.run_forward(inputs)  # the context carries the prompts' bounds (query_start_loc)
        pooled = self.pooler.pool(hidden, inputs.num_scheduled)
        vectors = self.pooler.finish(pooled, [s.pooling_params for s in states])
        req_ids = inputs.req_ids
        return ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=[[] for _ in req_ids],
            pooler_output=dict(zip(req_ids, vectors)),
        )
