"""Logging set-up shared by every host process: one stderr handler on the ``host`` logger."""

from __future__ import annotations

import logging
import os
import sys

ENV_LOG_LEVEL = "HOST_LOG_LEVEL"


def configure_logging(default_level: str = "INFO") -> None:
    """Attach a stderr handler to the ``host`` logger once; ``HOST_LOG_LEVEL`` overrides."""
    root = logging.getLogger("host")
    level_name = os.environ.get(ENV_LOG_LEVEL, default_level).upper()
    level = getattr(logging, level_name, None)
    if not isinstance(level, int):
        raise ValueError(f"{ENV_LOG_LEVEL}={level_name!r} is not a log level; use DEBUG, INFO, WARNING or ERROR")
    root.setLevel(level)
    if not any(getattr(h, "_host_handler", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(name)s: %(message)s", "%H:%M:%S"))
        handler._host_handler = True  # type: ignore[attr-defined]
        root.addHandler(handler)
