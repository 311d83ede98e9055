"""For plugin authors: :mod:`host.interfaces.executor`, re-exported (the engine imports it from there)."""

from host.interfaces.executor import *  # noqa: F401,F403 - every public name, re-exported
