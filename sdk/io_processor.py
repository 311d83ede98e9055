"""For plugin authors: :mod:`host.interfaces.io_processor`, re-exported (the engine imports it from there)."""

from host.interfaces.io_processor import *  # noqa: F401,F403 - every public name, re-exported
