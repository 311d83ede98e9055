"""For plugin authors: :mod:`host.interfaces.reasoning_parser`, re-exported (the engine imports it from there)."""

from host.interfaces.reasoning_parser import *  # noqa: F401,F403 - every public name, re-exported
