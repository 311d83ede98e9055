"""For plugin authors: :mod:`host.interfaces.endpoint`, re-exported (the engine imports it from there)."""

from host.interfaces.endpoint import *  # noqa: F401,F403 - every public name, re-exported
