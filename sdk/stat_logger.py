"""Stat logger base class: a sink for per-step engine metrics. Runs in the API process."""

from __future__ import annotations

from typing import Any, ClassVar


class StatLogger:
    """Receives scheduler and iteration stats after every engine step."""

    name: ClassVar[str] = ""

    def __init__(self, config: Any = None, engine_index: int = 0) -> None:
        self.config = config
        self.engine_index = engine_index

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        raise NotImplementedError

    def log(self) -> None:
        """Emit what was recorded (called periodically); default: nothing."""

    def log_engine_initialized(self) -> None:
        """Called once when the engine is up; default: nothing."""
