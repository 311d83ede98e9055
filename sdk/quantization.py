"""For plugin authors: :mod:`host.interfaces.quantization`, re-exported (the engine imports it from there)."""

from host.interfaces.quantization import *  # noqa: F401,F403 - every public name, re-exported
