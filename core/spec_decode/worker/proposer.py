"""The proposer interface: what drafts the next step's tokens, on the worker, once this step's
tokens are known. ``make_proposer`` picks the class for ``--speculative-config``'s method.

A proposer's life in the model runner:

1. ``__init__(config, runner)`` when the runner loads (the target model not loaded yet);
2. ``load()`` right after the target model is loaded (a draft model loads its weights here and
   may share the target's embedding / LM head through ``runner.model``);
3. ``kv_cache_specs()`` is appended after the target's specs, so the engine's block count
   accounts for the draft's KV bytes and the draft shares the scheduler's block budget (the
   same block ids, separate tensors); ``[]`` for a proposer without a KV cache;
4. ``bind_kv_caches(caches)``: one tensor per spec returned above, each viewed on the same
   block ids as the target's layers;
5. ``propose(batch)`` after every step that emitted tokens: one draft list per request of the
   batch (``[]``: no drafts for that request). The scheduler trims the drafts to its budget,
   ``max_model_len`` and ``max_tokens``, so a proposer may return up to ``batch.k`` tokens
   without checking those.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from host.core.config import EngineConfig
    from host.core.kv_cache.spec import KVCacheSpec
    from host.core.worker.input_batch import StepInputs
    from host.core.worker.model_runner import ModelRunner


@dataclass
class DraftBatch:
    """What a proposer sees after one step: the requests that emitted tokens this step.

    ``token_ids[i]`` holds request ``i``'s tokens (prompt + outputs) including the ones emitted
    this step (host memory, int64). ``num_accepted[i]`` is how many tokens request ``i`` emitted
    this step (accepted drafts + 1). ``inputs`` is the step's flattened layout (positions,
    slot mapping, query_start_loc, ... of every input token, drafts included) and
    ``hidden_states`` the target's last hidden states for every input token, in the same order.
    ``sampled_token_ids[i]`` are the tokens request ``i`` emitted this step. ``k`` is
    ``num_speculative_tokens``. ``rows[i]`` is the request's row in ``inputs`` (``inputs``
    may also hold requests that emitted nothing, e.g. a prefill chunk short of its prompt's
    end); ``num_rejected[i]`` how many of its drafts were rejected (their input positions hold
    KV that the next step overwrites).
    """

    req_ids: list[str]
    token_ids: list[np.ndarray]
    num_accepted: np.ndarray
    inputs: "StepInputs"
    hidden_states: torch.Tensor
    sampled_token_ids: list[list[int]]
    k: int
    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    num_rejected: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


class Proposer:
    """Drafts tokens for the next step, on the worker, after this step's tokens are known."""

    def __init__(self, config: "EngineConfig", runner: "ModelRunner") -> None:
        self.config = config
        self.runner = runner
        self.spec = config.speculative
        self.k = int(config.speculative.num_speculative_tokens)

    def load(self) -> None:
        """Called after the target model is loaded."""

    def kv_cache_specs(self) -> list["KVCacheSpec"]:
        """The proposer's own KV layers (appended after the target's); ``[]`` for none."""
        return []

    def bind_kv_caches(self, caches: list[torch.Tensor]) -> None:
        """One KV tensor per spec of :meth:`kv_cache_specs`, views on the same block ids."""

    def propose(self, batch: DraftBatch) -> list[list[int]]:
        """One draft list per request of ``batch`` (at most ``batch.k`` tokens; may be ``[]``)."""
        raise NotImplementedError


# method -> "module:Class" (imported lazily: the ngram path never imports a draft model)
PROPOSERS: dict[str, str] = {
    "ngram": "host.core.spec_decode.worker.ngram:NgramProposer",
    "draft_model": "host.core.spec_decode.worker.draft_model:DraftModelProposer",
    "eagle": "host.core.spec_decode.worker.eagle:EagleProposer",
}


def make_proposer(config: "EngineConfig", runner: "ModelRunner") -> Proposer | None:
    """The proposer of ``config.speculative.method``, or ``None`` without speculation."""
    spec = getattr(config, "speculative", None)
    if spec is None:
        return None
    target = PROPOSERS.get(spec.method)
    if target is None:
        raise ValueError(
            f"speculative method {spec.method!r} has no proposer; use one of {', '.join(PROPOSERS)}"
        )
    module_name, _, class_name = target.partition(":")
    try:
        cls: Any = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"speculative method {spec.method!r} is not available in this build ({e})") from None
    return cls(config, runner)
