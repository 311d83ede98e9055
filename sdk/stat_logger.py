"""For plugin authors: :mod:`host.interfaces.stat_logger`, re-exported (the engine imports it from there)."""

from host.interfaces.stat_logger import (  # noqa: F401 - re-exported
    FinishedRequestStats,
    IterationStats,
    StatLogger,
    StatLoggerContext,
)
