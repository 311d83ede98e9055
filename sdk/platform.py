"""For plugin authors: :mod:`host.interfaces.platform`, re-exported (the engine imports it from there)."""

from host.interfaces.platform import *  # noqa: F401,F403 - every public name, re-exported
