"""The handle of a launched step: its sampled token ids on their way to the host.

``ModelRunner.execute_model(..., non_blocking=True)`` returns a :class:`PendingStep` (built by the
sampling step, :mod:`host.core.worker.sampling_step`); the engine
core calls :meth:`PendingStep.get_output` when it needs the step's :class:`ModelRunnerOutput`
(with asynchronous scheduling, after the next step was launched)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from host.contracts.messages import TokenLogprobs
from host.contracts.runner_output import ModelRunnerOutput, StepTiming
from host.core.worker.sampler import LogprobsTensors

if TYPE_CHECKING:
    from host.core.worker.model_runner import ModelRunner


__all__ = ["PendingStep", "StepTiming"]  # StepTiming lives in .output (the runner reads it)


class PendingStep:
    """A launched step whose sampled token ids are on their way to the host: the copy goes to
    pinned memory asynchronously, and :meth:`get_output` waits for it (an event, not a device
    synchronisation), then records the tokens in the persistent batch (the runner's
    ``record_sampled`` phase)."""

    def __init__(self, runner: "ModelRunner", req_ids: list[str], final: np.ndarray, logprobs_k: list[int | None],
                 result: Any, prompt_logprobs: dict[str, list[TokenLogprobs]], timing: tuple[float, float, int]) -> None:
        self.runner = runner
        self.req_ids = req_ids
        self.final = final
        self.logprobs_k = logprobs_k
        self.logprobs = result.logprobs
        self.prompt_logprobs = prompt_logprobs
        self.timing = timing
        ids = result.sampled_token_ids
        self._event = None
        if ids.device.type == "cpu":
            self._host = ids
        else:
            self._host = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
            self._host.copy_(ids, non_blocking=True)
            self._event = getattr(torch, ids.device.type).Event()
            self._event.record()
        self._output: ModelRunnerOutput | None = None
        self.kv_connector_output: Any = None  # the KV connector's report (set by the runner)

    def get_output(self) -> ModelRunnerOutput:
        if self._output is not None:
            return self._output
        if self._event is not None:
            self._event.synchronize()  # the step's one wait for the device
        sampled = self._host.tolist()
        lp = self.logprobs
        if lp is not None and lp.token_ids.device.type != "cpu":
            lp = LogprobsTensors(lp.token_ids.cpu(), lp.logprobs.cpu(), lp.ranks.cpu())
        t_sampled = time.perf_counter()
        sampled_lists, logprob_lists = self.runner.record_sampled(self.req_ids, self.final, sampled, self.logprobs_k, lp)
        runner = self.runner
        if runner.step_timings is not None:
            t_start, t_sample, num_tokens = self.timing
            runner.step_timings.append(StepTiming(len(self.req_ids), num_tokens, t_sampled - t_sample, time.perf_counter() - t_start))
        self._output = ModelRunnerOutput(
            req_ids=self.req_ids,
            req_id_to_index={r: i for i, r in enumerate(self.req_ids)},
            sampled_token_ids=sampled_lists,
            logprobs=logprob_lists if any(x is not None for x in logprob_lists) else None,
            prompt_logprobs=self.prompt_logprobs,
            kv_connector_output=self.kv_connector_output,
        )
        return self._output
