"""The load balancer's state in one worker (seed §8.3 ``EplbModelState``).

:class:`EplbState` is built by the model runner for a model with MoE layers when
``--enable-eplb`` is on, and its :meth:`step` is called once after every forward step that
scheduled tokens — on every rank of the engine alike, so the ranks count the same steps.

- **Recording.** Only the last ``window_size`` steps of each ``step_interval`` are recorded
  (before that the window would be overwritten anyway): the layers' ``record_load`` switch is set
  for those steps only, and each recorded step's per-physical-expert counts go into the ring
  ``window [window_size, L, P]``.
- **Rearranging.** At each interval's end the window's load is folded into logical experts
  (``scatter_add`` over ``physical_to_logical``), summed over the ranks (one all-reduce for all
  layers), handed to the policy (a registered :class:`host.interfaces.eplb_policy.EplbPolicy`),
  and the new map is kept only if it improves balancedness by at least ``min_improvement``
  (relative). The decision is agreed by a MIN all-reduce on the EPLB group's CPU side, so every
  rank takes the same branch.
- **Moving.** Sync mode gathers the new slots' weights and commits at once; async mode gathers
  on a background thread and commits at the first later step at which every rank's gather is
  done (again agreed by an all-reduce). Both end in the same maps and weights.

:meth:`stats` is what the runner reports: balancedness of the last window, rearrangements done
and skipped.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import torch
import torch.distributed as dist

from host.core.moe.eplb.maps import balancedness, logical_load
from host.core.moe.eplb.rearrange import commit, gather_new_weights
from host.core.moe.layer import FusedMoE

logger = logging.getLogger("host.eplb")


class EplbState:
    def __init__(self, layers: list[FusedMoE], config: Any, group: Any, policy: Any) -> None:
        if not layers:
            raise ValueError("--enable-eplb needs a mixture-of-experts model; this one has no MoE layers")
        self.layers, self.config, self.group, self.policy = layers, config, group, policy
        first = layers[0]
        self.num_logical, self.num_physical, self.num_ranks = first.num_logical, first.num_physical, first.ep_size
        for layer in layers:
            layer.slot_tensors()  # a method whose experts cannot move is refused here, at start-up
        self.window = torch.zeros(config.window_size, len(layers), self.num_physical, dtype=torch.int64)
        self.steps = 0
        self.recorded = 0  # steps recorded in the current interval
        self.rearrangements = 0
        self.skipped = 0
        self.last_balancedness: float | None = None
        self._pending: dict[str, Any] | None = None  # async: the gather in flight
        self._set_recording(self._should_record(1))

    # -- the step ------------------------------------------------------------------------------
    def _should_record(self, step: int) -> bool:
        """Whether engine step ``step`` (1-based) lies in the last ``window_size`` of its interval."""
        phase = (step - 1) % self.config.step_interval
        return phase >= self.config.step_interval - self.config.window_size

    def _set_recording(self, on: bool) -> None:
        for layer in self.layers:
            layer.record_load = on

    def step(self) -> None:
        """Account for the forward step that just ran (see the module docstring)."""
        self.steps += 1
        if self.layers[0].record_load:
            row = self.recorded % self.config.window_size
            for li, layer in enumerate(self.layers):
                self.window[row, li].copy_(layer.expert_load)
                layer.expert_load.zero_()
            self.recorded += 1
        if self._pending is not None:
            self._maybe_commit_async()
        if self.steps % self.config.step_interval == 0:
            self.rearrange()
            self.recorded = 0
            self.window.zero_()
        self._set_recording(self._should_record(self.steps + 1))

    # -- rearranging ---------------------------------------------------------------------------
    def current_maps(self) -> torch.Tensor:
        return torch.stack([layer.physical_to_logical.cpu() for layer in self.layers])

    def rearrange(self) -> bool:
        """Decide and (sync) apply or (async) start one rearrangement; True when one was started."""
        if self._pending is not None:
            return False  # the previous one has not committed yet
        current = self.current_maps()
        load = logical_load(self.window.sum(0), current, self.num_logical)
        if self.group.world_size > 1:  # one all-reduce for every layer
            dist.all_reduce(load, group=self.group.cpu_group)
        before = balancedness(load, current, self.num_ranks)
        new = self.policy.rebalance(load, self.num_physical, self.num_ranks, current)
        after = balancedness(load, new, self.num_ranks)
        self.last_balancedness = before
        gain = (after - before) / before if before > 0 else 0.0
        go = self._agree(bool(gain >= self.config.min_improvement and not torch.equal(new, current)))
        if self.config.log_balancedness:
            logger.info("EPLB step %d: balancedness %.4f -> %.4f (%s)", self.steps, before, after,
                        "rearranging" if go else f"kept: gain {gain:.1%} < {self.config.min_improvement:.0%}")
        if not go:
            self.skipped += 1
            return False
        if self.config.use_async:
            self._start_async(new)
        else:
            commit(self.layers, new, gather_new_weights(self.layers, new, self.group))
            self.rearrangements += 1
        return True

    def _agree(self, flag: bool) -> bool:
        """``flag`` on every rank (a MIN all-reduce over the EPLB group's CPU group)."""
        if self.group.world_size == 1:
            return flag
        box = torch.tensor([1 if flag else 0], dtype=torch.int32)
        dist.all_reduce(box, op=dist.ReduceOp.MIN, group=self.group.cpu_group)
        return bool(box.item())

    def _start_async(self, new: torch.Tensor) -> None:
        pending: dict[str, Any] = {"maps": new, "weights": None, "error": None}

        def work() -> None:
            try:
                pending["weights"] = gather_new_weights(self.layers, new, self.group)
            except BaseException as exc:  # surfaced at commit
                pending["error"] = exc

        pending["thread"] = threading.Thread(target=work, name="host-eplb-gather", daemon=True)
        self._pending = pending
        pending["thread"].start()

    def _maybe_commit_async(self) -> None:
        pending = self._pending
        assert pending is not None
        if not self._agree(not pending["thread"].is_alive()):
            return
        pending["thread"].join()
        self._pending = None
        if pending["error"] is not None:
            raise RuntimeError(f"EPLB's background weight gather failed: {pending['error']}") from pending["error"]
        commit(self.layers, pending["maps"], pending["weights"])
        self.rearrangements += 1

    def finish(self) -> None:
        """Wait for an async rearrangement in flight and commit it (shutdown, tests)."""
        if self._pending is not None:
            self._pending["thread"].join()
            self._maybe_commit_async()

    def stats(self) -> dict[str, Any]:
        return {"balancedness": self.last_balancedness, "rearrangements": self.rearrangements, "skipped": self.skipped}
