"""How weights are read."""

from __future__ import annotations

from dataclasses import dataclass

from host.core.config.common import LOAD_FORMATS


@dataclass
class LoadConfig:
    """How weights are read: ``auto`` (safetensors / GGUF by what is there) or ``dummy``
    (random weights from the config, for benchmarks)."""

    load_format: str = "auto"

    def __post_init__(self) -> None:
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format={self.load_format!r} is not supported; use one of {', '.join(LOAD_FORMATS)}")
