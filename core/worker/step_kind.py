"""The step-kind protocol: how the model runner runs one step without knowing which kind it is.

A step kind composes the runner's public phases (``update_states``, ``prepare_inputs``,
``run_forward``, ``logits_at``, ``keep_sampled_on_device``, ``record_sampled``,
``prompt_logprobs``; see :mod:`host.core.worker.model_runner`) into a whole step. There are three,
peers of each other, each built for one runner by the worker's
:func:`~host.core.worker.worker.make_step_kind`:

* ``"sampling"``: :class:`host.core.worker.sampling_step.SamplingStep`, the plain step
  (sample one token per request, asynchronously when asked);
* ``"speculative"``: :class:`host.core.spec_decode.worker.verify.SpecDecodeStep`
  (``--speculative-config``: verify the drafts, propose the next ones);
* ``"pooling"``: :class:`host.core.pooling.worker.PoolingRunner` (a pooling model: one
  vector per prompt, nothing sampled).

This module imports no step kind and not the runner: the runner depends on the protocol only,
the step kinds on the runner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from host.contracts.runner_output import ModelRunnerOutput, StepHandle
    from host.contracts.scheduler_output import SchedulerOutput


class StepKind(Protocol):
    """One kind of step, bound to its runner. The runner builds it in ``load_model`` once the
    target model is loaded (before compiling the forward), then calls :meth:`load` (after
    compiling), :meth:`kv_cache_specs` and :meth:`initialize_kv_cache` while it sizes and
    allocates the KV cache, and :meth:`execute` for every step."""

    name: str  # "sampling", "speculative" or "pooling"
    computes_logits: bool  # whether its steps score tokens (the memory profile computes logits then)

    def load(self) -> None:
        """Load what the step kind needs beyond the target model (a proposer's draft model)."""
        ...

    def kv_cache_specs(self) -> list[Any]:
        """KV cache specs of its own layers, appended after the target's (``[]`` for none)."""
        ...

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate the KV tensors of :meth:`kv_cache_specs` on ``num_blocks`` blocks."""
        ...

    def execute(self, so: "SchedulerOutput", non_blocking: bool) -> "ModelRunnerOutput | StepHandle":
        """Run one step: the finished output, or with ``non_blocking`` (where the kind
        supports it) a handle whose ``get_output()`` waits for it."""
        ...
