"""``--enable-lora``: LoRA adapters on the base model."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LoRAConfig:
    """``--enable-lora``: serve LoRA adapters on the base model (docs/lora.md).

    ``max_loras``: adapters one step may use (the device slots); ``max_lora_rank``: the largest
    rank accepted (every slot is this wide); ``max_cpu_loras``: adapters kept in CPU memory
    behind the slots (``None``: ``max_loras``; at least ``max_loras``).
    """

    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_loras, int) or self.max_loras < 1:
            raise ValueError(f"max_loras={self.max_loras!r} must be an integer >= 1 (--max-loras 4 for four adapters per step)")
        if not isinstance(self.max_lora_rank, int) or self.max_lora_rank < 1:
            raise ValueError(f"max_lora_rank={self.max_lora_rank!r} must be an integer >= 1, e.g. --max-lora-rank 16")
        if self.max_cpu_loras is None:
            self.max_cpu_loras = self.max_loras
        elif not isinstance(self.max_cpu_loras, int) or self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras={self.max_cpu_loras!r} must be >= max_loras={self.max_loras} (the CPU tier holds "
                f"every adapter in a slot); use --max-cpu-loras {self.max_loras} or more"
            )
