"""For plugin authors: :mod:`host.interfaces.errors`, re-exported (the engine imports it from there)."""

from host.interfaces.errors import *  # noqa: F401,F403 - every public name, re-exported
