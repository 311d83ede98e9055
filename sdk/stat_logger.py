"""For plugin authors: :mod:`host.interfaces.stat_logger`, re-exported (the engine imports it from there)."""

from host.interfaces.stat_logger import *  # noqa: F401,F403 - every public name, re-exported
