"""Which engine settings LoRA runs with, checked once at start-up (the engine process)."""

from __future__ import annotations

from typing import Any


def check_lora_support(config: Any) -> None:
    """Refuse, with the reason and the fix, a LoRA engine this build cannot run: tensor
    parallelism (the wrappers hold whole, unsharded A/B weights) and models whose layers are not
    the Llama family's q/k/v/o and gate/up/down linears."""
    if config.parallel.tensor_parallel_size > 1:
        raise ValueError(
            f"--enable-lora with tensor_parallel_size={config.parallel.tensor_parallel_size} is not supported yet "
            "(the LoRA weights are not sharded); use -tp 1 (pipeline parallelism -pp N works), or merge the adapter "
            "into the weights"
        )
