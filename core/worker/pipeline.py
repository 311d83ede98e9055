"""Pipeline parallelism in the model runner: this worker's stage of the layer stack.

With ``-pp N`` the model's layers are split into N stages (the model builds only its own:
``model.start_layer`` .. ``model.end_layer``, global indices). Every stage gets the same
:class:`~host.contracts.scheduler_output.SchedulerOutput` and keeps the same persistent batch; per
step the first stage embeds the tokens and runs its layers, each later stage receives the
hidden states and the residual (``[num_tokens, hidden_size]`` each, so the shape is known from
the plan and nothing else travels) from the stage before it, and only the last stage computes
logits and samples. A non-last stage's step output is empty.

Because only the last stage samples, the scheduler sends every running request's input tokens
with the plan (``CachedRequestData.new_token_ids``): :meth:`PipelineStage.apply_new_token_ids`
appends the ones a non-last stage has not seen. Sampling state that depends on earlier tokens
(penalties, seeds, grammars) is only read on the last stage, which records its own samples.

Each stage holds the KV cache of its own layers only; the runner's ``kv_caches`` list stays
indexed by global layer index (:meth:`PipelineStage.layer_views`: empty tensors for the other
stages' layers), so an attention layer finds its cache by ``layer_idx`` as without pipelining.
The engine's KV cache manager is global: a block id names the same block in every layer of
every stage, so the number of blocks is what the tightest stage can hold.

Whole-stack shortcuts (decode graphs, a platform's fused decode kernel) run every layer from
the embedding to the final norm and cannot stop at a stage boundary: :meth:`PipelineStage.
disable_whole_stack_paths` turns them off under pipelining.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from host.core.distributed.parallel_state import get_pp_group

logger = logging.getLogger("host.pipeline")

# what a non-last stage hands to the next one, in the order it is sent
INTERMEDIATE_KEYS = ("hidden", "residual")

_NO_CACHE = torch.empty(0)


class PipelineStage:
    """This worker's pipeline stage: its layers, its neighbours, and the stage-to-stage transfer.

    Built from a loaded model (``PipelineStage.of(model, hf_config, dtype, device)``). With one
    stage every method is a no-op and :attr:`enabled` is false, so the runner calls them
    unconditionally."""

    def __init__(
        self,
        group: Any,
        num_layers: int,
        start_layer: int,
        end_layer: int,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if not 0 <= start_layer < end_layer <= num_layers:
            raise ValueError(
                f"pipeline stage {group.rank_in_group} owns layers [{start_layer}, {end_layer}) of "
                f"{num_layers}; a stage needs at least one layer inside the model"
            )
        self.group = group
        self.num_layers = num_layers
        self.start_layer = start_layer
        self.end_layer = end_layer
        self.hidden_size = hidden_size
        self.dtype = dtype
        self.device = device

    @classmethod
    def of(cls, model: Any, hf_config: Any, dtype: torch.dtype, device: torch.device) -> "PipelineStage":
        """The stage ``model`` was built for (the whole stack when pipelining is off)."""
        group = get_pp_group()
        num_layers = int(hf_config.num_hidden_layers)
        if group.world_size == 1:
            return cls(group, num_layers, 0, num_layers, int(hf_config.hidden_size), dtype, device)
        missing = [a for a in ("start_layer", "end_layer", "is_first_stage", "is_last_stage") if not hasattr(model, a)]
        if missing:
            raise ValueError(
                f"{type(model).__name__} does not support pipeline parallelism (it has no "
                f"{', '.join(missing)}); run it with --pipeline-parallel-size 1"
            )
        stage = cls(group, num_layers, int(model.start_layer), int(model.end_layer), int(hf_config.hidden_size), dtype, device)
        if (bool(model.is_first_stage), bool(model.is_last_stage)) != (stage.is_first, stage.is_last):
            raise ValueError(
                f"the model says stage first={model.is_first_stage} last={model.is_last_stage} but this "
                f"worker is pipeline rank {group.rank_in_group} of {group.world_size}"
            )
        return stage

    # -- position --------------------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        return self.group.world_size > 1

    @property
    def is_first(self) -> bool:
        return self.group.is_first_rank

    @property
    def is_last(self) -> bool:
        return self.group.is_last_rank

    @property
    def layers(self) -> range:
        """Global indices of the layers this stage runs (and holds KV cache for)."""
        return range(self.start_layer, self.end_layer)

    # -- stage to stage --------------------------------------------------------------------------
    def forward_kwargs(self, num_tokens: int) -> dict[str, Any]:
        """Extra arguments of this stage's ``model.forward``: on a non-first stage the previous
        stage's ``intermediate`` (received now, blocking until it arrives)."""
        if not self.enabled or self.is_first:
            return {}
        shape = (num_tokens, self.hidden_size)
        return {"intermediate": {k: self.group.recv(shape, self.dtype) for k in INTERMEDIATE_KEYS}}

    def send(self, intermediate: dict[str, torch.Tensor]) -> None:
        """Hand this (non-last) stage's output to the next stage."""
        if not isinstance(intermediate, dict) or set(intermediate) != set(INTERMEDIATE_KEYS):
            got = sorted(intermediate) if isinstance(intermediate, dict) else type(intermediate).__name__
            raise TypeError(f"a non-last pipeline stage must return a dict with {list(INTERMEDIATE_KEYS)}, got {got}")
        for key in INTERMEDIATE_KEYS:
            self.group.send(intermediate[key].to(self.dtype))

    def dummy_kwargs(self, num_tokens: int) -> dict[str, Any]:
        """What :meth:`forward_kwargs` gives, as zeros and without communication (the memory
        profiling run, where stages do not talk)."""
        if not self.enabled or self.is_first:
            return {}
        shape = (num_tokens, self.hidden_size)
        return {"intermediate": {k: torch.zeros(shape, dtype=self.dtype, device=self.device) for k in INTERMEDIATE_KEYS}}

    # -- the persistent batch on a stage that does not sample ------------------------------------
    def apply_new_token_ids(self, batch: Any, cached: Any) -> None:
        """Append to a non-last stage's persistent batch the tokens the last stage sampled.

        ``cached.new_token_ids[i]`` are request ``cached.req_ids[i]``'s input tokens of this
        step (from its computed count on); those past the batch's known tokens are new."""
        if not self.enabled or self.is_last:
            return
        for req_id, computed, tokens in zip(cached.req_ids, cached.num_computed_tokens, cached.new_token_ids):
            index = batch.req_id_to_index[req_id]
            known = int(batch.num_tokens[index])
            new = tokens[known - computed :] if known >= computed else tokens
            if not new:
                continue
            end = min(known + len(new), batch.max_model_len)
            batch.token_ids[index, known:end] = np.asarray(new[: end - known], dtype=np.int64)
            batch.num_tokens[index] = known + len(new)
            batch.states[index].output_token_ids.extend(new)

    # -- KV cache --------------------------------------------------------------------------------
    def layer_views(self, buffer: torch.Tensor, shape: tuple[int, ...]) -> list[torch.Tensor]:
        """Per-layer views of ``buffer`` (one ``shape`` page table per owned layer), indexed by
        global layer index: the other stages' layers get an empty tensor."""
        per_layer = int(np.prod(shape))
        views = [_NO_CACHE] * self.num_layers
        for i, layer in enumerate(self.layers):
            views[layer] = buffer[i * per_layer : (i + 1) * per_layer].view(shape)
        return views

    # -- what cannot run under pipelining --------------------------------------------------------
    def disable_whole_stack_paths(self, model: Any, compilation: Any) -> None:
        """Turn off decode graphs and a fused whole-stack decode kernel (they run every layer
        and the final norm in one call, which a stage boundary cannot interrupt)."""
        if not self.enabled:
            return
        if compilation.cuda_graphs:
            if "cuda_graphs" in compilation.explicit or "cuda_graph_sizes" in compilation.explicit:
                raise ValueError(
                    "decode graphs (--cuda-graph-sizes) cannot run under pipeline parallelism; "
                    "drop the flag or use --pipeline-parallel-size 1"
                )
            logger.info("Pipeline parallelism: decode graphs are off")
            compilation.cuda_graphs = False
            compilation.cuda_graph_sizes = []
        decoder = getattr(model, "model", None)
        if getattr(decoder, "decode_kernel", None) is not None:
            logger.info("Pipeline parallelism: the fused decode kernel is off")
            decoder.decode_kernel = None

    def __repr__(self) -> str:
        return (
            f"PipelineStage({self.group.rank_in_group}/{self.group.world_size}, layers "
            f"[{self.start_layer}, {self.end_layer}) of {self.num_layers})"
        )
