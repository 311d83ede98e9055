"""For plugin authors: :mod:`host.interfaces.kv_connector`, re-exported (the engine imports it from there)."""

from host.interfaces.kv_connector import *  # noqa: F401,F403 - every public name, re-exported
