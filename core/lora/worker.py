"""The model runner's LoRA side (worker): wrap the model at load, map each step's tokens to
adapter slots."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from host.core.lora.layers import wrap_model
from host.core.lora.punica import LoRAMapping
from host.core.lora.slots import LoRASlots

logger = logging.getLogger("host.lora")


class WorkerLoRA:
    """What a model runner holds with ``--enable-lora``: the wrappers and their slots.

    Built after the platform prepared the model (so the wrappers call the platform's layers).
    Decode graphs and ``torch.compile`` are turned off: the per-step slot mapping is host data
    the captured graphs cannot take."""

    def __init__(self, config: Any, model: torch.nn.Module, hf_config: Any, dtype: torch.dtype, device: torch.device) -> None:
        lora = config.lora
        self.wrappers = wrap_model(model, hf_config, lora, dtype, device)
        self.slots = LoRASlots(lora, hf_config, self.wrappers, dtype, device)
        compilation = config.compilation
        if compilation.cuda_graphs or compilation.torch_compile:
            explicit = {"cuda_graphs", "cuda_graph_sizes", "torch_compile"} & set(compilation.explicit)
            if explicit:
                raise ValueError(f"--enable-lora runs without decode graphs and torch.compile; drop "
                                 f"{', '.join(sorted(explicit))} (or use -O1)")
            logger.info("LoRA: decode graphs and torch.compile are off")
            compilation.cuda_graphs = False
            compilation.cuda_graph_sizes = []
            compilation.torch_compile = False
        nbytes = sum(w.lora_a.numel() * w.lora_a.element_size() + w.lora_b.numel() * w.lora_b.element_size()
                     for w in self.wrappers)
        logger.info("LoRA: %d linears wrapped, %d slots of rank %d (%.1f MiB)", len(self.wrappers),
                    lora.max_loras, lora.max_lora_rank, nbytes / 2**20)

    def step_mapping(self, states: list[Any], num_scheduled: np.ndarray) -> LoRAMapping | None:
        """The mapping for one step's requests (their runner states, in input order)."""
        return self.slots.step_mapping([getattr(s, "lora_request", None) for s in states], num_scheduled)
