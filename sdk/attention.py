"""For plugin authors: :mod:`host.interfaces.attention`, re-exported (the engine imports it from there)."""

from host.interfaces.attention import *  # noqa: F401,F403 - every public name, re-exported
